"""The drafter body's forward of a few positions, without transformers' per-call machinery (issue #36).

Why: an eager draft step of a small drafter costs far more than reading its weights, and much of the rest is
Python around the ops, not the ops. Measured with torch.profiler on pair G's default drafter (Gemma-3-270M bf16,
k = 11,296, 96 new tokens; Intel Xeon model 207, 2 cores, AVX-512 BF16, 2026-12-07): a third of a draft step's time
was in no aten op at all (the step's own self time): the model's decorators (config defaults, output capture), its
mask building, 18 decoder-layer and attention module calls with their keyword plumbing, the attention-interface
lookup, the cache's dispatch, and a ``torch.cat`` of every layer's whole cache for each new column.

What: for the decoder families of ``FAMILIES``, :func:`lean_forward` runs the same modules in the same order on
the same values as the body's own forward: the embedding, the norms, the projections, the model's own
``apply_rotary_pos_emb`` and rotary module, transformers' own mask functions (``create_causal_mask``,
``create_sliding_window_causal_mask``) and its sdpa attention function, the MLP. It skips the decoder-layer and
attention modules' calls (their bodies are inlined here) and appends each new column to a dynamic cache layer in
place (:func:`append`): a layer's keys and values are the first columns of a larger buffer, so a step writes its
own column instead of copying the whole cache; a rollback (the engine's ``keep``: a narrower view) costs nothing
and the next step overwrites the rejected columns. Where the fast linears chose a drafter layer's int8 copy for
the step's row count (``kernels.decided_int8``), q/k/v and gate/up run as one int8 kernel call each on their
stacked copies (``kernels.stacked_int8``: per-row quantization, so the same values), o and down on their copies
without the dispatch; a norm the fast linears run fused is called as such (``kernels.fused_norm_scale``), and
Gemma's q and k norms (each head normed alone) and their rotary run on q's and k's heads at once.

Checked, not assumed: a body's first eligible call runs its own forward and the lean one on a copy of the cache,
and the lean forward serves that body only where the two agree bitwise (hidden states and the cache's new
columns); else the body keeps its own forward (``CHECKED``). A call in which a kernel trial ran
(``kernels.trials_run``: the two forwards may have run different kernels) decides nothing; the next call checks
again. So what the drafter computes is unchanged, on any transformers release this runs with (tests: bitwise on
Llama, Qwen2 and Gemma-3 bodies, padded rows, several fed positions, rollbacks, a sliding window crossed, the
stacked layers in float32 and bfloat16). Only a drafter's body is ever served (``generation.hooks`` via
``generate_kernels``), never a target's, and only on a dynamic cache (compiled steps keep the model's forward).
``drafter.use_lean_forward = False`` (:func:`wants_lean_forward`) keeps the body's own forward.

Measured (``scripts/bench_lean_forward.py``, pair G's default drafter, 16 ShareGPT prompts, machine E, 2026-12-07):
draft step 31.6 -> 26.7 ms, 1.26x -> 1.38x same-run target-only; docs/results/cpu-goals-machine-e-2026-12-07.md.
"""

from __future__ import annotations

import inspect
import sys
import weakref

import torch
from torch import nn
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPast

from .kernels import decided_int8, fused_norm, fused_norm_scale, int8_linear, stacked_int8, trials_run
from .modeling import cache_kwarg

__all__ = ["FAMILIES", "MAX_POSITIONS", "append", "eligible", "lean_forward", "lean_forwards", "served",
           "wants_lean_forward"]

# body class -> where its decoder layers put their norms: "pre" (Llama: input norm, attention, residual; post-attention
# norm, MLP, residual) or "sandwich" (Gemma-3: each block's output normed again before its residual)
FAMILIES = {"LlamaModel": "pre", "MistralModel": "pre", "Qwen2Model": "pre", "Qwen3Model": "pre",
            "Gemma3TextModel": "sandwich"}
# Forwards of up to this many positions go lean (draft steps, a round's fed tokens); a prompt's prefill keeps the
# model's own forward (its ops dominate there, not their dispatch).
MAX_POSITIONS = 16
# Columns a buffer keeps free beyond what it holds when it is (re)made: a call's draft steps then write in place.
HEADROOM = 256

# the mask functions' cache keyword (``past_key_values``; ``cache`` where transformers renamed it)
_MASK_CACHE = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"
# body -> whether its lean forward matched its own bitwise (decided on its first eligible call)
CHECKED: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def _grow(layer, name: str, held: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """``torch.cat([held, new], dim=-2)`` as a view of ``layer``'s buffer ``name``: written in place where ``held`` is
    the buffer's first columns and room is left, else copied once into a new buffer with ``HEADROOM``."""
    buf = layer.__dict__.get(name)
    n = held.shape[-2] if held.dim() == 4 else 0  # (a lazily initialised layer holds an empty 1-D tensor)
    m = new.shape[-2]
    if (buf is None or n + m > buf.shape[-2] or buf.dtype != new.dtype or buf.device != new.device
            or buf.shape[:2] != new.shape[:2] or buf.shape[-1] != new.shape[-1]
            or (n and (held.data_ptr() != buf.data_ptr() or held.stride() != buf.stride()))):
        buf = new.new_empty((*new.shape[:2], max(n + m + HEADROOM, (n + m) * 3 // 2), new.shape[-1]))
        if n:
            buf[:, :, :n].copy_(held)
        layer.__dict__[name] = buf
    buf[:, :, n : n + m].copy_(new)
    return buf[:, :, : n + m]


def append(layer: DynamicLayer, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``layer.update(keys, values)`` of a ``DynamicLayer`` (the same tensors, as views of growing buffers)."""
    if not layer.is_initialized:
        layer.lazy_initialization(keys, values)
    layer.keys = _grow(layer, "_lean_keys", layer.keys, keys)
    layer.values = _grow(layer, "_lean_values", layer.values, values)
    return layer.keys, layer.values


def eligible(body: nn.Module, cache, positions: int) -> bool:
    """Whether ``body``'s forward of ``positions`` positions after ``cache`` can go lean (not yet whether it
    matched: ``CHECKED``)."""
    config = body.config
    return (type(body).__name__ in FAMILIES and 1 <= positions <= MAX_POSITIONS and not body.training
            and config._attn_implementation == "sdpa" and type(cache) is DynamicCache
            and len(cache.layers) >= config.num_hidden_layers
            and all(type(layer) is DynamicLayer for layer in cache.layers)
            and not getattr(config, "use_bidirectional_attention", False)
            and getattr(config, "attn_logit_softcapping", None) is None
            and not torch.is_grad_enabled() and not torch.compiler.is_compiling())


class _Layer:
    """What a decoder layer's lean forward runs, read off its modules once per generate call (``_plan``): each
    RMSNorm's fused scale where the fast linears run it fused (``kernels.fused_norm_scale``; else the module is
    called), and per row count the stacked int8 copies of q/k/v and gate/up and the int8 copies of o/down where
    the fast linears chose the int8 copy for every one of them (``kernels.decided_int8``; else the modules)."""

    __slots__ = ("layer", "attn", "kind", "norms", "qk_norm", "by_rows")

    def __init__(self, layer: nn.Module, kind: str):
        self.layer, self.attn, self.kind = layer, layer.self_attn, kind
        self.norms = {name: fused_norm_scale(getattr(layer, name)) for name in _NORMS_OF if hasattr(layer, name)}
        q_norm, k_norm = getattr(self.attn, "q_norm", None), getattr(self.attn, "k_norm", None)
        self.qk_norm = None
        if q_norm is not None:
            q, k = fused_norm_scale(q_norm), fused_norm_scale(k_norm)
            # Gemma's style, both fused: one norm over q's and k's heads together (each head normed alone, so the
            # same values), scaled per head by its own (1 + weight)
            if (q is not None and k is not None and q[0] is not None and k[0] is not None
                    and q_norm.eps == k_norm.eps):
                heads = self.attn.config.num_attention_heads, self.attn.config.num_key_value_heads
                self.qk_norm = torch.cat([q[0].expand(heads[0], -1), k[0].expand(heads[1], -1)])  # a row per head
        self.by_rows: dict[int, tuple | None] = {}

    def linears(self, rows: int):
        """(q/k/v stacked (weight, scales, bias, splits), o copy, gate/up stacked (weight, scales, split), down
        copy) for forwards of ``rows`` rows, or None (the modules are called)."""
        if rows in self.by_rows:
            return self.by_rows[rows]
        attn, mlp = self.attn, self.layer.mlp
        mods = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        biases = [m.bias is not None for m in mods[:3]]
        if len(set(biases)) > 1 or mlp.gate_proj.bias is not None or mlp.up_proj.bias is not None:
            self.by_rows[rows] = None  # (biases on some of q/k/v, or on gate/up: the modules)
            return None
        copies = [decided_int8(m, rows) if isinstance(m, nn.Linear) else None for m in mods]
        if any(c is None for c in copies):
            return None  # (not cached: a choice still in trial is made later in the call)
        kinds = {c.scales.dtype for c in copies}  # the kernel's input dtype: "int8" and "int8_bf16" mixed: the modules
        if len(kinds) > 1:
            self.by_rows[rows] = None
            return None
        act = kinds.pop()
        weight, scales = stacked_int8(mods[:3])
        qkv = (weight, scales.to(act))
        bias = torch.cat([m.bias for m in mods[:3]]) if biases[0] else None
        o, down = copies[3], copies[6]
        weight, scales = stacked_int8(mods[4:6])
        gate_up = (weight, scales.to(act))
        self.by_rows[rows] = ((*qkv, bias, [m.out_features for m in mods[:3]]), (o.weight, o.scales, mods[3].bias),
                              (*gate_up, mods[4].out_features), (down.weight, down.scales, mods[6].bias))
        return self.by_rows[rows]


_NORMS_OF = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
# body -> its layers' plans for the generate call in progress (built on its first lean call, dropped on exit)
_PLANS: weakref.WeakKeyDictionary[nn.Module, list[_Layer]] = weakref.WeakKeyDictionary()


def _plan(body: nn.Module) -> list[_Layer]:
    plan = _PLANS.get(body)
    if plan is None:
        kinds = list(getattr(body.config, "layer_types", None) or ["full_attention"] * body.config.num_hidden_layers)
        plan = _PLANS[body] = [_Layer(layer, kinds[i])
                               for i, layer in enumerate(body.layers[: body.config.num_hidden_layers])]
    return plan


def _norm(layer: _Layer, name: str, x: torch.Tensor) -> torch.Tensor:
    fused = layer.norms[name]
    module = getattr(layer.layer, name)
    return module(x) if fused is None else fused_norm(module, x, fused[0])


def lean_forward(body: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 position_ids: torch.Tensor | None, cache: DynamicCache) -> torch.Tensor:
    """``body(input_ids, attention_mask=..., position_ids=..., past_key_values=cache).last_hidden_state`` for a
    body of ``FAMILIES`` (see the module docstring); appends to ``cache``."""
    config = body.config
    sandwich = FAMILIES[type(body).__name__] == "sandwich"
    hidden = body.embed_tokens(input_ids)
    if position_ids is None:
        position_ids = (torch.arange(hidden.shape[1], device=hidden.device) + cache.get_seq_length())[None]
    plan = _plan(body)
    kinds = {layer.kind for layer in plan}
    mask_kwargs = {"config": config, "inputs_embeds": hidden, "attention_mask": attention_mask, _MASK_CACHE: cache,
                   "position_ids": position_ids}
    masks = {"full_attention": create_causal_mask(**mask_kwargs) if "full_attention" in kinds else None}
    if "sliding_attention" in kinds:
        masks["sliding_attention"] = create_sliding_window_causal_mask(**mask_kwargs)
    if sandwich:  # Gemma-3: a rotary table per layer type
        rope = {kind: body.rotary_emb(hidden, position_ids, kind) for kind in kinds}
    else:
        shared = body.rotary_emb(hidden, position_ids)
        rope = {kind: shared for kind in kinds}
    modeling = sys.modules[type(plan[0].attn).__module__]
    rotate, rotate_half = modeling.apply_rotary_pos_emb, modeling.rotate_half
    shape = hidden.shape[:-1]
    rows = hidden.shape[0] * hidden.shape[1]
    for i, lp in enumerate(plan):
        layer, attn = lp.layer, lp.attn
        linears = lp.linears(rows)
        residual = hidden
        x = _norm(lp, "input_layernorm", hidden)
        split = (*shape, -1, attn.head_dim)
        if linears is not None:  # one int8 kernel call for q, k and v
            weight, scales, bias, widths = linears[0]
            qkv = int8_linear(x, weight, scales, bias)
            nq, nk = widths[0], widths[1]
            v = qkv[..., nq + nk :].view(split).transpose(1, 2)
        else:
            q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
            v = v.view(split).transpose(1, 2)
        cos, sin = rope[lp.kind]
        if linears is not None and lp.qk_norm is not None:  # q's and k's heads normed and rotated together
            heads = qkv[..., : nq + nk].view(split)
            normed = (torch.nn.functional.rms_norm(heads.float(), (attn.head_dim,), None, attn.q_norm.eps)
                      * lp.qk_norm).type_as(heads).transpose(1, 2)
            cos1, sin1 = cos.unsqueeze(1), sin.unsqueeze(1)
            turned = (normed * cos1) + (rotate_half(normed) * sin1)
            q, k = turned[:, : nq // attn.head_dim], turned[:, nq // attn.head_dim :]
        else:
            if linears is not None:
                q, k = qkv[..., :nq], qkv[..., nq : nq + nk]
            q, k = q.view(split).transpose(1, 2), k.view(split).transpose(1, 2)
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = rotate(q, k, cos, sin)
        k, v = append(cache.layers[i], k, v)
        out, _ = sdpa_attention_forward(attn, q, k, v, masks[lp.kind], dropout=0.0, scaling=attn.scaling,
                                        sliding_window=getattr(attn, "sliding_window", None))
        out = out.reshape(*shape, -1).contiguous()
        out = attn.o_proj(out) if linears is None else int8_linear(out, *linears[1])
        if sandwich:
            hidden = residual + _norm(lp, "post_attention_layernorm", out)
            residual = hidden
            x = _norm(lp, "pre_feedforward_layernorm", hidden)
        else:
            hidden = residual + out
            residual = hidden
            x = _norm(lp, "post_attention_layernorm", hidden)
        mlp = layer.mlp
        if linears is None:
            x = mlp(x)
        else:
            weight, scales, width = linears[2]
            gate_up = int8_linear(x, weight, scales)
            x = int8_linear(mlp.act_fn(gate_up[..., :width]) * gate_up[..., width:], *linears[3])
        if sandwich:
            x = _norm(lp, "post_feedforward_layernorm", x)
        hidden = residual + x
    return body.norm(hidden)


def _copy(cache: DynamicCache) -> DynamicCache:
    """A copy of a dynamic cache's layers (for the first call's check): new tensors, the same columns."""
    twin = DynamicCache()
    twin.layers = []
    for layer in cache.layers:
        copy = DynamicLayer()
        if layer.is_initialized:
            copy.lazy_initialization(layer.keys, layer.values)
            copy.keys, copy.values = layer.keys.clone(), layer.values.clone()
        twin.layers.append(copy)
    return twin


def _serve(self: nn.Module, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
           inputs_embeds=None, use_cache=None, cache=None, **kwargs):
    """The body's forward while :func:`lean_forwards` holds it: lean where eligible and checked, else its own."""
    cache = cache if cache is not None else past_key_values
    own_kwargs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
                  "inputs_embeds": inputs_embeds, "use_cache": use_cache, **kwargs}
    if cache is not None:
        own_kwargs[cache_kwarg(self)] = cache
    if (input_ids is None or inputs_embeds is not None or kwargs or use_cache is False or cache is None
            or not eligible(self, cache, input_ids.shape[1]) or CHECKED.get(self) is False):
        return type(self).forward(self, **own_kwargs)
    if self not in CHECKED:  # the first eligible call: its own forward, and the lean one on a copy, compared
        twin = _copy(cache)
        before = [layer.keys.shape[-2] if layer.is_initialized and layer.keys.dim() == 4 else 0
                  for layer in cache.layers]
        trials = trials_run()
        own = type(self).forward(self, **own_kwargs)
        lean = lean_forward(self, input_ids, attention_mask, position_ids, twin)
        if trials_run() == trials:  # (a kernel trial in either forward: they ran different kernels; next call)
            CHECKED[self] = torch.equal(own.last_hidden_state, lean) and all(
                torch.equal(a.keys[:, :, n:], b.keys[:, :, n:]) and torch.equal(a.values[:, :, n:], b.values[:, :, n:])
                for a, b, n in zip(cache.layers, twin.layers, before))
        return own
    return BaseModelOutputWithPast(last_hidden_state=lean_forward(self, input_ids, attention_mask, position_ids, cache),
                                   past_key_values=cache)


def served(body: nn.Module) -> bool | None:
    """Whether ``body``'s lean forward matched its own (None: not checked yet in this process)."""
    return CHECKED.get(body)


class lean_forwards:  # noqa: N801 - a context manager used like a function
    """Within the block, ``body`` (a drafter's body) runs :func:`_serve` as its forward; restored on exit. Nothing
    is swapped when disabled, when ``body`` is not of ``FAMILIES`` or when someone already replaced its forward."""

    def __init__(self, body: nn.Module | None, enabled: bool = True):
        self.body = body if (enabled and body is not None and type(body).__name__ in FAMILIES
                             and "forward" not in body.__dict__) else None

    def __enter__(self) -> bool:
        if self.body is not None:
            self.body.forward = _serve.__get__(self.body, type(self.body))
        return self.body is not None

    def __exit__(self, *exc) -> None:
        if self.body is not None:
            self.body.__dict__.pop("forward", None)
            _PLANS.pop(self.body, None)


def wants_lean_forward(assistant) -> bool:
    """Whether a generate call serves the drafter's body with :func:`lean_forward`: unless the drafter (or SSD
    session) says ``use_lean_forward = False``."""
    return bool(getattr(assistant, "use_lean_forward", True))
