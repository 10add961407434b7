"""The trimmed drafter model: any causal-LM body with an LM head that keeps only the chosen vocabulary rows.

One source of truth for the vocabulary map: the persistent ``d2t`` buffer holds, for every draft id
(head row) ``i``, the ABSOLUTE target id ``d2t[i]`` (ascending). Everything else (the ``t2d`` lookup,
EAGLE-3 offsets, SGLang hot-token lists) is derived from it. The map's SHA-256 is also written into the
config, so a checkpoint whose map is missing or corrupt is refused at load time instead of silently
mapping draft ids to the first N target ids (the classic acceptance-collapse bug).

Shipped with every checkpoint (``auto_map`` names this file and configuration.py), so ``trust_remote_code=True``
loads a drafter where hf_vocabspec is not installed: this module imports only the standard library, torch,
transformers and configuration.py. Building a drafter (:func:`~hf_vocabspec.trimming.trim_drafter`) and checking
it against a target (:mod:`hf_vocabspec.compatibility`) live in the package, not here.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration import (
    MODEL_TYPE,
    TrimmedDrafterConfig,
    VocabularyMapError,
    check_batched_speculation,
    check_drafting_settings,
    check_compile_draft_step,
    check_weight_quantization,
)

__all__ = [
    "TrimmedDrafter",
    "cache_kwarg",
    "forward_has_cache",
    "model_body",
    "output_cache",
    "position_limit",
    "vocab_map_sha256",
]


def vocab_map_sha256(d2t: torch.Tensor) -> str:
    """Checksum of the vocabulary map (written to config.json, checked at load time)."""
    return hashlib.sha256(d2t.detach().to("cpu", torch.int64).contiguous().numpy().tobytes()).hexdigest()


def model_body(model: PreTrainedModel) -> nn.Module:
    """The decoder body of a causal LM (what runs before its LM head): the base-model attribute, else ``model``
    / ``transformer`` (Llama-4 text names its prefix ``language_model`` but holds ``model``), else get_decoder()."""
    candidates = (getattr(model, getattr(model, "base_model_prefix", "model"), None), getattr(model, "model", None),
                  getattr(model, "transformer", None), model.get_decoder())
    for body in candidates:
        if isinstance(body, nn.Module) and body is not model and not hasattr(body, "lm_head"):
            return body
    raise ValueError(f"Cannot find the decoder body of {type(model).__name__} (no base model without an LM head): "
                     "pass a *ForCausalLM model.")


@functools.lru_cache(maxsize=None)
def _forward_takes_cache(cls: type) -> bool:
    return "cache" in inspect.signature(cls.forward).parameters


@functools.lru_cache(maxsize=None)
def forward_has_cache(cls: type) -> bool:
    """Whether a model's forward takes a KV cache at all (openai-gpt's does not)."""
    params = inspect.signature(cls.forward).parameters
    return "cache" in params or "past_key_values" in params


def cache_kwarg(model: nn.Module) -> str:
    """The name the installed transformers gives the KV cache in a model forward: ``cache`` from 5.24 on
    (``past_key_values`` still works there with a FutureWarning), ``past_key_values`` before."""
    return "cache" if _forward_takes_cache(type(model)) else "past_key_values"


def output_cache(out):
    """The cache a model forward returned (``out.cache`` from transformers 5.24, ``out.past_key_values`` before)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def position_limit(model) -> int | None:
    """The most positions ``model`` handles, read under the names architectures use (GPT-2's ``n_positions``, ...);
    a trimmed drafter's is its body's (its own config has none). None where no limit is declared."""
    model = getattr(model, "drafter", model) if not isinstance(model, PreTrainedModel) else model  # an SSD session
    config = getattr(model, "config", None)
    if isinstance(model, TrimmedDrafter):
        config = model_body(model).config
    elif config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    names = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length", "max_seq_len",
             "max_seq_length")
    limits = [v for v in (getattr(config, n, None) for n in names) if isinstance(v, int) and not isinstance(v, bool)
              and v > 0]
    return min(limits) if limits else None


def _head_transform(body_config: PreTrainedConfig):
    """Architecture-specific logit post-processing that the causal-LM class applies after its head."""
    softcap = getattr(body_config, "final_logit_softcapping", None)
    scaling = getattr(body_config, "logits_scaling", None)  # Granite divides
    scale = getattr(body_config, "logit_scale", None)  # Cohere multiplies

    def transform(logits: torch.Tensor) -> torch.Tensor:
        if scaling is not None and scaling != 1:
            logits = logits / scaling
        if scale is not None and scale != 1:
            logits = logits * scale
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        return logits

    return transform


# --- weight-only quantized drafting (config.weight_quantization) ---------------------------------------------------
# Why: a draft step of one row is memory-bound; its floor is one read of the drafter's weights. Measured on a 2-core
# AMD EPYC with AVX-512 BF16 (2026-11-26, torch 2.13, one row, distinct weights cycled beyond the caches): a
# 4864x896 layer took 0.49 ms in bf16 (oneDNN packed), 0.35 ms through torch's int8 kernel and 0.12 ms through its
# int4 kernel.
# What it means: quantizing REPLACES each weight by its quantized values (round to nearest, stored in the drafter's
# dtype: a lossy, one-way change, as any quantization), so the drafter is one model whatever kernel runs it; the
# int kernels run those values for forwards of a few rows, F.linear for longer ones (prompts, training). A saved
# drafter holds the quantized values; loading re-derives the int copies (re-quantizing quantized values gives them
# back, up to one rounding of the scale).
INT4_GROUP_SIZE = 128  # inputs per int4 group (64 or 32 where a layer's inputs are not a multiple of it)
# Forwards of more rows than this run F.linear on the (quantized) weights: the weight-only kernels are made for a
# few rows (machine above, Qwen2.5-Coder-0.5B bf16 forward of M positions: int4 0.69x / 0.59x / 1.01x and int8
# 0.76x / 1.07x / 1.99x of the bf16 decode step at M = 1 / 4 / 5; int8 over a 200-token prompt ~4x slower than GEMM).
QUANTIZED_MAX_ROWS = 4


class _QuantizedWeight(NamedTuple):
    scheme: str
    stamp: tuple  # (weight storage, version, dtype): a changed weight is quantized again
    weight: torch.Tensor  # int8 (N, K), or int4 packed for the CPU kernel
    scales: torch.Tensor  # int8: (N,); int4: (K / group, N, 2) scales and zeros, in the weight's dtype
    group: int = 0  # int4: inputs per group


def quantization_ops_available(scheme: str) -> bool:
    """Whether this torch has the CPU kernel ``scheme`` needs."""
    names = {"int8": ("_weight_int8pack_mm",),
             "int4": ("_weight_int4pack_mm_for_cpu", "_convert_weight_to_int4pack_for_cpu")}[scheme]
    return all(hasattr(torch.ops.aten, n) for n in names)


def quantizable(module: nn.Module, scheme: str) -> bool:
    """Exactly ``nn.Linear`` (subclasses have other weight semantics), float, with a shape the kernel takes."""
    if type(module) is not nn.Linear or module.weight.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    return scheme != "int4" or _int4_group(module.in_features) is not None


def _int4_group(in_features: int) -> int | None:
    """The largest group size the int4 kernel takes (INT4_GROUP_SIZE, 64, 32) that divides the layer's inputs."""
    return next((g for g in (INT4_GROUP_SIZE, 64, 32) if g <= INT4_GROUP_SIZE and in_features % g == 0), None)


def version_of(t: torch.Tensor) -> int:
    """``t``'s version counter (an in-place change moves it): what the copies made of a weight are stamped with. -1 for
    an inference tensor (a model made under ``torch.inference_mode``), which keeps none: its copies are then kept for
    its storage (a weight changed in place inside inference mode keeps stale copies; replaced, it gets new ones)."""
    try:
        return t._version
    except RuntimeError:  # "Inference tensors do not track version counter"
        return -1


def _stamp(weight: torch.Tensor) -> tuple:
    return weight.data_ptr(), version_of(weight), weight.dtype


def quantize_weight(weight: torch.Tensor, scheme: str) -> tuple[_QuantizedWeight, torch.Tensor]:
    """Round-to-nearest weight-only quantization: int8 symmetric per output row (``q * scale``); int4 asymmetric
    per group of ``INT4_GROUP_SIZE`` inputs (``(q - 8) * scale + zero``, the kernel's formula). Returns the kernel's
    copy and the values it multiplies by (float32, scales rounded to the weight's dtype as the kernel holds them)."""
    w = weight.detach().float()
    dtype = weight.dtype
    if scheme == "int8":
        scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).to(dtype)
        q = torch.round(w / scale.float()[:, None]).clamp(-127, 127)
        values = q * scale.float()[:, None]
        return _QuantizedWeight(scheme, _stamp(weight), q.to(torch.int8).contiguous(), scale), values
    N, K = w.shape
    group = _int4_group(K)
    pad = -N % 16  # the packing takes rows in blocks of 16: zero rows pad it (their outputs are cut off)
    if pad:
        w = torch.cat([w, w.new_zeros(pad, K)])
    groups = w.reshape(N + pad, K // group, group)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = ((hi - lo) / 15).clamp(min=1e-6).to(dtype).float()
    zero = (lo + 8 * scale).to(dtype).float()
    q = torch.round((groups - (zero - 8 * scale)[..., None]) / scale[..., None]).clamp(0, 15)
    values = ((q - 8) * scale[..., None] + zero[..., None]).reshape(N + pad, K)[:N]
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).reshape(N + pad, K).contiguous(), 1)
    scales = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(dtype)
    return _QuantizedWeight(scheme, _stamp(weight), packed, scales, group), values


def _quantized_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    q = self.__dict__.get("_vocabspec_quantized")
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if (q is None or not 1 <= rows <= QUANTIZED_MAX_ROWS
            or (torch.is_grad_enabled() and (self.weight.requires_grad or x.requires_grad))):
        return F.linear(x, self.weight, self.bias)
    if x.device.type != "cpu" or self.weight.device.type != "cpu":
        raise RuntimeError(f"weight_quantization={q.scheme!r} runs on CPU only: call drafter.quantize_weights(None) "
                           f"before running the drafter on {x.device.type}.")
    # weights changed (loaded, converted, trained): their int copy is re-derived. Not while torch.compile traces
    # (``data_ptr`` would break the graph at every layer): a compiled caller runs ``refresh_weight_quantization``
    # before its calls instead.
    if not torch.compiler.is_compiling() and q.stamp != _stamp(self.weight):
        q = _refresh(self, q)
    flat = x.reshape(rows, x.shape[-1]).contiguous()
    if flat.dtype != q.scales.dtype:
        flat = flat.to(q.scales.dtype)
    if q.scheme == "int8":
        y = torch.ops.aten._weight_int8pack_mm(flat, q.weight, q.scales)
    else:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, q.weight, q.group, q.scales)
        if y.shape[-1] != self.out_features:
            y = y[:, : self.out_features]
    y = y.reshape(*x.shape[:-1], y.shape[-1]).to(x.dtype)
    return y if self.bias is None else y + self.bias


def serve_quantized(module: nn.Linear, q: _QuantizedWeight | None) -> None:
    """Give ``module`` the int kernel's forward on its copy ``q`` (from :func:`quantize_weight`): forwards of up to
    QUANTIZED_MAX_ROWS rows run the kernel, traceable by torch.compile; ``q=None`` takes it away again."""
    if q is None:
        module.__dict__.pop("_vocabspec_quantized", None)
        module.__dict__.pop("forward", None)
        return
    module.__dict__["_vocabspec_quantized"] = q
    module.forward = _quantized_forward.__get__(module, nn.Linear)


def _refresh(module: nn.Linear, q: _QuantizedWeight) -> _QuantizedWeight:
    q = quantize_weight(module.weight, q.scheme)[0]
    module.__dict__["_vocabspec_quantized"] = q
    return q


def refresh_weight_quantization(module: nn.Module) -> None:
    """Re-derive the int copies of ``module``'s quantized layers whose weights changed since they were made (what
    every eager call of such a layer checks): for a compiled forward, whose traced layers do not check."""
    for layer in module.modules():
        q = layer.__dict__.get("_vocabspec_quantized")
        if q is not None and q.stamp != _stamp(layer.weight):
            _refresh(layer, q)


def apply_weight_quantization(modules: Iterable[nn.Module], scheme: str | None, *, write_values: bool = True) -> int:
    """Quantize every quantizable linear of ``modules`` in place and give it the int kernel's forward (``scheme``
    None: take the kernels away; the weights keep their values); returns how many layers run the kernels.
    ``write_values=False`` (loading a quantized checkpoint): the weights already hold quantized values and are
    kept exactly as saved; only the kernels' copies are derived."""
    modules = list(modules)
    for module in modules:
        if "_vocabspec_quantized" in module.__dict__:
            serve_quantized(module, None)
    if scheme is None:
        return 0
    if not quantization_ops_available(scheme):
        raise RuntimeError(f"weight_quantization={scheme!r} needs torch's CPU kernels, which torch {torch.__version__} "
                           "lacks: upgrade torch, or call drafter.quantize_weights(None).")
    todo = [m for m in modules if quantizable(m, scheme) and "forward" not in m.__dict__]  # not wrapped by others
    for module in todo:
        if module.weight.device.type != "cpu":
            raise ValueError(f"weight_quantization={scheme!r} runs on CPU only, the drafter is on "
                             f"{module.weight.device.type}: keep it on CPU or call drafter.quantize_weights(None).")
    for module in todo:
        q, values = quantize_weight(module.weight, scheme)
        if write_values:
            with torch.no_grad():
                module.weight.copy_(values.to(module.weight.dtype))
        serve_quantized(module, q._replace(stamp=_stamp(module.weight)))
    return len(todo)


def check_drafter_location(where) -> None:
    """A drafter's path or repo id, checked before anything reads it (and before any Hub request): a path that does
    not exist, a file, or a folder without config.json is refused in one line; a repo id passes."""
    if isinstance(where, (str, os.PathLike)) and not os.path.exists(where) and (
            os.fspath(where).startswith((".", "/", "~")) or os.fspath(where).count("/") > 1):
        raise FileNotFoundError(f"No such drafter directory: {os.fspath(where)!r} (check the path; a Hub repo id "
                                "looks like 'owner/name').")
    if isinstance(where, (str, os.PathLike)) and os.path.isfile(where):
        raise FileNotFoundError(f"{os.fspath(where)!r} is a file: pass the folder a drafter was saved to "
                                "(drafter.save_pretrained(dir)).")
    if where is not None and os.path.isdir(where) and not os.path.isfile(os.path.join(where, "config.json")):
        raise FileNotFoundError(f"{os.fspath(where)!r} has no config.json: not a saved drafter (save one with "
                                "drafter.save_pretrained(dir)).")


class TrimmedDrafter(PreTrainedModel, GenerationMixin):
    """A causal-LM drafter whose LM head keeps only ``config.draft_vocab_size`` rows.

    Input embeddings stay full (any context token can be embedded). ``forward`` returns logits over the
    FULL vocabulary (pruned ids at -inf) so the model also works standalone; speculative decoding uses
    :meth:`draft_logits` on the trimmed rows directly and never touches the full vocabulary per token.
    """

    config_class = TrimmedDrafterConfig
    base_model_prefix = "model"
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = False

    def __init__(self, config: TrimmedDrafterConfig):
        super().__init__(config)
        body_config = config.body_config()
        self.model = AutoModel.from_config(body_config)
        self.lm_head = nn.Linear(body_config.hidden_size, config.draft_vocab_size, bias=False)
        # -1 marks "not loaded": a checkpoint without the map fails validation instead of going silent.
        self.register_buffer("d2t", torch.full((config.draft_vocab_size,), -1, dtype=torch.long), persistent=True)
        self._head_transform = _head_transform(body_config)
        self._t2d: torch.Tensor | None = None
        self.last_speculation_stats = None
        self.quantized_layers = 0
        if config.rdk:
            self._register_rdk_buffers(int(config.rdk["num_targets"]))
        if config.context_head_size:
            self._register_context_head(int(config.context_head_size), body_config.hidden_size)
        self.post_init()

    # --- runtime switches: views of their config fields (one value: what a call uses is what a save writes) ----
    @property
    def use_context_tokens(self):
        """Draft pruned tokens already in the context (greedy and sampling): they get head rows on the fly from the
        tied embedding or the kept ``context_head``. The value of ``config.context_tokens``."""
        return self.config.context_tokens

    @use_context_tokens.setter
    def use_context_tokens(self, value) -> None:
        self.config.context_tokens = value

    @property
    def use_verify_head(self):
        """Verify through the target's verify-time LM head (hf_vocabspec.verify_head). The value of
        ``config.verify_head``."""
        return getattr(self.config, "verify_head", True)

    @use_verify_head.setter
    def use_verify_head(self, value) -> None:
        self.config.verify_head = value

    @property
    def compile_draft_step(self) -> bool | str:
        """Run the one-token draft steps compiled: True always, "auto" once the eager ones have cost what compiling
        is expected to, False never (``generation.hooks.compiles_draft_step``; the call that compiles pays the
        compiles). The value of ``config.compile_draft_step`` (False where a checkpoint was saved without it)."""
        return getattr(self.config, "compile_draft_step", False)

    @compile_draft_step.setter
    def compile_draft_step(self, value) -> None:
        self.config.compile_draft_step = check_compile_draft_step(
            value, "set drafter.compile_draft_step = True, False or \"auto\"")

    @property
    def use_rdk(self):
        """Sample through the attached RDK kernel (read only under do_sample=True); False without a kernel. The value
        of ``config.rdk["enabled"]``."""
        return self.config.rdk.get("enabled", True) if self.config.rdk else False

    @use_rdk.setter
    def use_rdk(self, value) -> None:
        if not self.config.rdk:
            if value:
                raise ValueError("This drafter has no RDK kernel to switch on: attach one with "
                                 "drafter.set_rdk_kernel(kernel).")
            return
        self.config.rdk = {**self.config.rdk, "enabled": value}

    # --- weight-only quantized drafting -------------------------------------------------------------------
    def quantize_weights(self, scheme: str | None, *, _loading: bool = False) -> TrimmedDrafter:
        """Quantize the linear layers (body and kept head) to weight-only ``"int8"`` / ``"int4"`` values, drafted
        through torch's int kernels (CPU); None takes the kernels away (the values stay: quantizing is one-way, load
        the drafter again for full precision). Sets ``config.weight_quantization``: a saved drafter holds the
        quantized values and loads back with the kernels. Changes only what the drafter proposes: verification
        keeps the output the target's."""
        scheme = check_weight_quantization(scheme)
        self.quantized_layers = apply_weight_quantization(self._quantizable_modules(), scheme,
                                                          write_values=not _loading)
        self.config.weight_quantization = scheme
        return self

    def _quantizable_modules(self) -> list[nn.Module]:
        return [*self.model.modules(), self.lm_head]

    # --- pruned head rows for context tokens (untied heads) ---------------------------------------------
    def _register_context_head(self, rows: int, hidden: int) -> None:
        # -1 / NaN mark "not loaded": a checkpoint that announces kept rows but lacks them fails validation.
        self.register_buffer("context_ids", torch.full((rows,), -1, dtype=torch.long), persistent=True)
        self.register_buffer("context_head", torch.full((rows, hidden), float("nan")), persistent=True)

    def validate_context_head(self, missing_keys: Iterable[str] = ()) -> None:
        """Refuse kept pruned rows that config.json announces but the weights lack (``missing_keys`` from loading:
        transformers fills a missing buffer with uninitialised memory), of the wrong shape, or whose ids overlap
        the kept head (torch-only check, so remote-code loading without hf_vocabspec keeps it)."""
        c = int(getattr(self.config, "context_head_size", 0) or 0)
        if not c:
            return
        ids, rows = getattr(self, "context_ids", None), getattr(self, "context_head", None)
        fix = ("Re-create the drafter with `hf_vocabspec.trim_drafter(base_model, keep_token_ids)` (it keeps the "
               "pruned rows of an untied head), or set config.context_head_size = 0 and context tokens off.")
        missing = sorted(k for k in missing_keys if k.split(".")[-1] in ("context_ids", "context_head"))
        if missing or ids is None or rows is None or ids.shape != (c,) or rows.shape[0] != c or bool((ids < 0).any()):
            raise VocabularyMapError("config.json announces kept pruned head rows (context_head_size="
                                     f"{c}) but the weights lack {missing or '`context_ids`/`context_head`'}. {fix}")
        if bool((ids >= self.config.vocab_size).any()) or (c > 1 and not bool((ids[1:] > ids[:-1]).all())):
            raise VocabularyMapError(f"`context_ids` must be strictly increasing target ids below {self.config.vocab_size}. {fix}")
        if bool((self.t2d[ids] >= 0).any()):
            raise VocabularyMapError(f"`context_ids` overlaps the kept vocabulary (`d2t`): weights from two drafters? {fix}")
        # No scan of the rows themselves: loaded from safetensors in their saved dtype they stay memory-mapped, and
        # only the rows context tokens read become resident (a full scan would page all of them in).

    # --- RDK kernel (out-of-vocabulary sampling, see rdk.py) --------------------------------------------
    def _register_rdk_buffers(self, num_targets: int) -> None:
        k = self.config.draft_vocab_size
        # NaN marks "not loaded": a checkpoint that announces a kernel but lacks it fails loudly.
        self.register_buffer("rdk_targets", torch.zeros((k, num_targets), dtype=torch.long), persistent=True)
        self.register_buffer("rdk_weights", torch.full((k, num_targets + 1), float("nan")), persistent=True)

    def set_rdk_kernel(self, kernel, enabled: bool = True) -> None:
        """Attach an :class:`~hf_vocabspec.rdk.RDKKernel` (saved with the checkpoint), or None to drop it."""
        if kernel is None:
            for name in ("rdk_targets", "rdk_weights"):
                self._buffers.pop(name, None)
            self.config.rdk = None
            return
        kernel = kernel.normalized().validate()
        if not torch.equal(kernel.d2t.cpu(), self.d2t.cpu()) or kernel.vocab_size != self.config.vocab_size:
            raise VocabularyMapError(
                "This RDK kernel was built for another kept vocabulary (its d2t differs from the drafter's). "
                "Fit it for this drafter: hf_vocabspec.rdk.fit_rdk_kernel(target, drafter.d2t, ...)."
            )
        self._register_rdk_buffers(kernel.num_targets)
        self.rdk_targets = kernel.targets.to(self.d2t.device)
        self.rdk_weights = kernel.weights.to(self.d2t.device)
        self.config.rdk = {"num_targets": kernel.num_targets, "method": kernel.method, "enabled": enabled,
                           "moved_mass": round(kernel.moved_mass, 6), **_jsonable(kernel.info)}

    def validate_rdk_buffers(self) -> None:
        """Refuse a kernel announced in config.json that the weights lack or hold corrupt (torch-only check,
        so a checkpoint loads with ``trust_remote_code`` where hf_vocabspec is not installed)."""
        if not self.config.rdk:
            return
        targets, weights = getattr(self, "rdk_targets", None), getattr(self, "rdk_weights", None)
        k = self.config.draft_vocab_size
        ok = (
            targets is not None and weights is not None
            and weights.shape == (k, targets.shape[1] + 1) and targets.shape[0] == k
            and bool(torch.isfinite(weights).all()) and not bool((weights < 0).any())
            and bool((weights.float().sum(1) > 0).all())
            and not bool((targets < 0).any()) and not bool((targets >= self.config.vocab_size).any())
        )
        if not ok:
            raise VocabularyMapError(
                "config.json announces an RDK kernel but the weights lack it or hold a corrupt one "
                "(`rdk_weights`/`rdk_targets`). " + _RDK_KERNEL_FIX
            )

    # --- vocabulary map -------------------------------------------------------------------------------
    @property
    def t2d(self) -> torch.Tensor:
        """target id -> draft id (or -1 where pruned); derived from ``d2t``, cached."""
        if self._t2d is None or self._t2d.device != self.d2t.device:
            t2d = torch.full((self.config.vocab_size,), -1, dtype=torch.long, device=self.d2t.device)
            t2d[self.d2t] = torch.arange(self.d2t.numel(), device=self.d2t.device)
            self._t2d = t2d
        return self._t2d

    def validate_vocab_map(self) -> None:
        """Refuse a missing, corrupt or inconsistent map (names the fix)."""
        d2t = self.d2t
        k, v = self.config.draft_vocab_size, self.config.vocab_size
        fix = "Re-create it with `hf_vocabspec.trim_drafter(base_model, keep_token_ids)` and save it again."
        if d2t.numel() != k:
            raise VocabularyMapError(f"Vocabulary map has {d2t.numel()} entries but config.draft_vocab_size={k}. {fix}")
        if k == 0:
            raise VocabularyMapError(f"Vocabulary map is empty. {fix}")
        if bool((d2t < 0).all()):  # the unfilled buffer: the weights carried no map
            raise VocabularyMapError(
                "The checkpoint has no draft->target vocabulary map (`d2t` buffer missing from the weights): "
                f"refusing to guess one, since mapping draft ids to the first N target ids collapses acceptance. {fix}"
            )
        if bool((d2t < 0).any()):
            pos = int((d2t < 0).nonzero()[0, 0])
            raise VocabularyMapError(f"Vocabulary map is corrupt: negative target id {int(d2t[pos])} at draft "
                                     f"position {pos} (of {k}). {fix}")
        if bool((d2t >= v).any()):
            raise VocabularyMapError(f"Vocabulary map has ids >= vocab_size={v}. {fix}")
        if k > 1 and not bool((d2t[1:] > d2t[:-1]).all()):
            raise VocabularyMapError(f"Vocabulary map must be strictly increasing (no duplicates). {fix}")
        expected = self.config.vocab_map_sha256
        if expected is not None and vocab_map_sha256(d2t) != expected:
            raise VocabularyMapError(
                "The draft->target vocabulary map in the weights does not match the checksum in config.json "
                f"(weights and config come from different drafters, or the file is corrupt). {fix}"
            )
        if self.lm_head.weight.shape[0] != k:
            raise VocabularyMapError(f"LM head has {self.lm_head.weight.shape[0]} rows, expected {k}. {fix}")

    # --- model plumbing ------------------------------------------------------------------------------
    def get_input_embeddings(self):
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.model.set_input_embeddings(value)

    def get_output_embeddings(self):
        return self.lm_head

    def draft_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Logits over the KEPT vocabulary only (draft ids); the hot path of drafting."""
        return self._head_transform(self.lm_head(hidden_states))

    @property
    def has_context_head(self) -> bool:
        """True when the pruned rows of an untied head were kept (``context_head``, read only for context rows)."""
        return bool(getattr(self.config, "context_head_size", 0)) and getattr(self, "context_head", None) is not None

    @property
    def supports_context_tokens(self) -> bool:
        """Context tokens need the pruned tokens' head rows: a tied input embedding, or the kept ``context_head``."""
        return self.has_context_head or bool((self.config.drafter_config or {}).get("tie_word_embeddings", False))

    def context_head_rows(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Output-embedding rows of (pruned) target ids: from the kept ``context_head`` of an untied head, else
        from the tied input embedding matrix."""
        if not self.supports_context_tokens:
            raise ValueError(
                "Context tokens need the LM-head rows of pruned tokens, which this drafter no longer has: its base "
                "model does not tie input and output embeddings and it was trimmed with keep_pruned_rows=False. "
                "Switch them off: `drafter.use_context_tokens = False` (or re-trim keeping the pruned rows)."
            )
        if not self.has_context_head:
            return self.get_input_embeddings().weight[target_ids]
        ids = self.context_ids
        pos = torch.searchsorted(ids, target_ids.to(ids.device)).clamp_(max=ids.numel() - 1)
        if not bool((ids[pos] == target_ids.to(ids.device)).all()):
            missing = target_ids[ids[pos] != target_ids.to(ids.device)][:5].tolist()
            raise ValueError(f"Target ids {missing} have no kept head row (neither in `d2t` nor in `context_ids`): "
                             "context tokens can only add pruned ids whose rows were kept.")
        return self.context_head[pos]

    def scatter_to_target(self, draft_logits: torch.Tensor, fill: float = float("-inf")) -> torch.Tensor:
        """Expand draft-space logits (..., K) to the full target vocabulary (..., V)."""
        out = draft_logits.new_full((*draft_logits.shape[:-1], self.config.vocab_size), fill)
        out[..., self.d2t] = draft_logits
        return out

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values=None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        cache=None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        cache = cache if cache is not None else past_key_values  # transformers 5.24 names it `cache`
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **{cache_kwarg(self.model): cache},
            **kwargs,
        )
        hidden = out.last_hidden_state
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.scatter_to_target(self.draft_logits(hidden).float())
        cache_field = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
        return CausalLMOutputWithPast(logits=logits, **{cache_field: output_cache(out)})

    def generate(self, *args, **kwargs):
        """Standalone generation (not the speculative hot path): give HF a cache built from the body config."""
        name = cache_kwarg(self.model)
        if kwargs.get(name) is None and kwargs.get("use_cache", True):
            from transformers.cache_utils import DynamicCache

            kwargs[name] = DynamicCache(config=self.model.config)
        return super().generate(*args, **kwargs)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Atomic: written to a temp sibling and swapped in, so an interrupted save leaves the old directory or
        nothing, never a config without weights. Other files already there (a tokenizer, a card) are kept.
        Inline rather than hf_vocabspec._io: this file ships with checkpoints (torch + transformers only)."""
        gen = getattr(self, "generation_config", None)
        if gen is not None and getattr(gen, "batched_speculation", None) is not None:
            check_batched_speculation(gen.batched_speculation)  # refused here, not by the loader of the checkpoint
            gen._from_model_config = False  # else transformers drops the field when loading generation_config.json
        if gen is not None:
            check_drafting_settings(gen, "drafter.generation_config.{}")
        if kwargs.get("push_to_hub"):
            return super().save_pretrained(save_directory, *args, **kwargs)
        final = os.path.abspath(os.fspath(save_directory))
        if os.path.isfile(final):
            raise FileExistsError(f"{final!r} is a file: save a drafter to a directory.")
        parent, name = os.path.split(final)
        try:
            os.makedirs(parent, exist_ok=True)
            tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
        except OSError as err:  # read-only, not ours, full: one line naming the folder, not the temp's raw path
            raise OSError(f"Cannot save the drafter to {final!r}: the folder {parent!r} is not writable "
                          f"({err.strerror or type(err).__name__}): choose a folder you can write, or fix its "
                          "permissions.") from err
        old = None
        try:
            result = super().save_pretrained(tmp, *args, **kwargs)
            if os.path.isdir(final):
                for entry in os.listdir(final):  # keep what others wrote there; drop only our stale weights
                    if not _stale_weights(entry) and not os.path.exists(os.path.join(tmp, entry)):
                        src = os.path.join(final, entry)
                        (shutil.copytree if os.path.isdir(src) else shutil.copy2)(src, os.path.join(tmp, entry))
                old = os.path.join(parent, os.path.basename(tmp).replace(".tmp-", ".old-", 1))
                os.replace(final, old)
            os.chmod(tmp, 0o755)
            os.replace(tmp, final)
        except BaseException:
            if old is not None and not os.path.exists(final):
                os.replace(old, final)  # the swap did not happen: the old directory goes back
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return result

    @classmethod
    def from_pretrained(cls, *args, **kwargs) -> TrimmedDrafter:
        """As ``PreTrainedModel.from_pretrained``, then refuse a checkpoint whose vocabulary map is bad."""
        want_info = kwargs.pop("output_loading_info", False)
        where = args[0] if args else kwargs.get("pretrained_model_name_or_path")
        check_drafter_location(where)
        local = where is not None and os.path.isdir(where)
        if local:
            _check_local_checkpoint(os.fspath(where))  # config.json vs the weights' shapes, before building anything
        try:
            model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        except VocabularyMapError:
            raise
        except Exception as err:  # safetensors' SafetensorError (not an OSError) for a cut or corrupt file, ...
            if not local and type(err).__name__ != "SafetensorError":
                raise  # a Hub id: transformers' own message (not found, no access, offline) says what to do
            first = next((ln.strip() for ln in str(err).splitlines() if ln.strip()), type(err).__name__)[:200]
            raise OSError(f"The drafter checkpoint in {os.fspath(where)!r} is truncated or corrupt, or was edited ({first}): "
                          "copy or download it again, or re-save the drafter.") from err
        if any(key == "d2t" or key.endswith(".d2t") for key in info.get("missing_keys", ())):
            raise VocabularyMapError(
                "The checkpoint has no draft->target vocabulary map (`d2t` missing from the weights): refusing to "
                "guess one, since mapping draft ids to the first N target ids collapses acceptance. Re-create it "
                "with `hf_vocabspec.trim_drafter(base_model, keep_token_ids)` and save it again."
            )
        missing_rdk = [k for k in info.get("missing_keys", ()) if k.split(".")[-1] in ("rdk_targets", "rdk_weights")]
        if missing_rdk:
            raise VocabularyMapError(
                f"config.json announces an RDK kernel but the weights lack {missing_rdk} (`rdk_weights`/`rdk_targets`). "
                + _RDK_KERNEL_FIX
            )
        _restore_batched_speculation(model, where, kwargs)
        model.validate_vocab_map()
        model.validate_rdk_buffers()  # a kernel announced in config must be present and sound
        model.validate_context_head(info.get("missing_keys", ()))  # kept pruned rows announced in config: present, sound
        check_compile_draft_step(model.compile_draft_step, f"set \"compile_draft_step\": true, false or \"auto\" in "
                                 f"config.json of the drafter in {os.fspath(where)!r}, or re-save the drafter")
        scheme = check_weight_quantization(getattr(model.config, "weight_quantization", None))
        if scheme is not None:
            model.quantize_weights(scheme, _loading=True)
        if model.use_context_tokens and not model.supports_context_tokens:  # only an edited config says so
            raise VocabularyMapError(
                f"The drafter in {os.fspath(where)!r} has context_tokens on in config.json, but pruned tokens have no head rows "
                "(its base does not tie its embeddings and no context head was kept): set \"context_tokens\": false in config.json "
                "or re-save the drafter.")
        return (model, info) if want_info else model


def _restore_batched_speculation(model: TrimmedDrafter, where, kwargs: dict) -> None:
    """Give the loaded generation_config the saved ``batched_speculation`` (checked): transformers drops fields it
    does not know from a file marked ``_from_model_config``, as drafters trimmed before this fix were saved."""
    if where is None or model.generation_config is None:
        return
    options = {k: kwargs[k] for k in ("cache_dir", "revision", "token", "local_files_only", "subfolder") if k in kwargs}
    path = os.fspath(where)
    try:
        if os.path.isdir(path):
            file = os.path.join(path, options.get("subfolder") or "", "generation_config.json")
        else:  # a Hub id: the file from_pretrained just fetched (cached)
            from transformers.utils import cached_file

            file = cached_file(path, "generation_config.json", _raise_exceptions_for_missing_entries=False, **options)
        with open(file, encoding="utf-8") as f:
            saved = json.load(f)
    except Exception:  # noqa: BLE001 - no (readable) generation_config.json: transformers' defaults stand
        return
    if not isinstance(saved, dict):
        return
    if "batched_speculation" not in saved:
        return
    value = saved["batched_speculation"]
    check_batched_speculation(value, fix=f"edit generation_config.json of the drafter in {os.fspath(where)!r}, or set "
                              "drafter.generation_config.batched_speculation and save it again")
    model.generation_config.batched_speculation = value


def _check_local_checkpoint(path: str) -> None:
    """Refuse a saved drafter whose config.json is not ours or disagrees with its weights, BEFORE transformers
    builds the model (an edited hidden_size or layer count would otherwise allocate whatever it says)."""
    fix = "copy or download the drafter again, or re-save it with drafter.save_pretrained(dir)"
    bad = f"The drafter checkpoint in {path!r}"
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    except FileNotFoundError:
        return  # from_pretrained says "has no config.json"
    except (OSError, ValueError) as err:
        raise OSError(f"{bad} has an unreadable config.json ({str(err)[:120]}): {fix}.") from None
    if isinstance(cfg, dict) and isinstance(cfg.get("model_type"), str) and cfg["model_type"] != MODEL_TYPE:
        raise OSError(f"{bad} is not a trimmed drafter (config.json model_type {cfg['model_type'][:60]!r}, expected "
                      f"{MODEL_TYPE!r}): it is a plain model; trim it first (`hf-vocabspec trim --drafter {path}` or "
                      "hf_vocabspec.trim_drafter(model, keep_token_ids)).")
    if not isinstance(cfg, dict) or cfg.get("model_type") != MODEL_TYPE:
        got = cfg.get("model_type") if isinstance(cfg, dict) else type(cfg).__name__
        raise OSError(f"{bad} is not a trimmed drafter (config.json model_type {str(got)[:60]!r}, expected "
                      f"{MODEL_TYPE!r}): {fix}.")
    body = cfg.get("drafter_config")
    ints = {"vocab_size": cfg.get("vocab_size"), "draft_vocab_size": cfg.get("draft_vocab_size")}
    if isinstance(body, dict):  # names other architectures spell differently (GPT-2's n_embd) are not checked
        ints |= {f"drafter_config.{k}": body[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size") if k in body}
    wrong = [k for k, v in ints.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if not isinstance(body, dict) or not isinstance(body.get("model_type"), str) or wrong:
        raise OSError(f"{bad} has a config.json with bad fields ({', '.join(wrong) or 'drafter_config'}): {fix}.")
    if "vocab_size" in body and cfg["vocab_size"] > body["vocab_size"]:
        raise OSError(f"{bad}: config.json vocab_size {cfg['vocab_size']} exceeds the body's embedding "
                      f"({body['vocab_size']} rows): {fix}.")
    if cfg["draft_vocab_size"] > cfg["vocab_size"]:
        raise OSError(f"{bad}: config.json keeps {cfg['draft_vocab_size']} of {cfg['vocab_size']} tokens: {fix}.")
    rdk = cfg.get("rdk")
    if rdk is not None and (not isinstance(rdk, dict) or isinstance(rdk.get("num_targets"), bool)
                            or not isinstance(rdk.get("num_targets"), int) or rdk["num_targets"] < 1):
        raise OSError(f"{bad} has a config.json whose `rdk` entry is bad: {fix}.")
    selection, rows = cfg.get("selection"), cfg.get("eval_results")  # shapes: configuration.SelectionInfo / EvalResultRow
    if selection is not None and not isinstance(selection, dict):
        raise OSError(f"{bad} has a config.json whose `selection` entry is not an object: {fix}.")
    if rows is not None and (not isinstance(rows, list) or not all(
            isinstance(r, dict) and {"metric_type", "metric_value", "dataset_name"} <= set(r) for r in rows)):
        raise OSError(f"{bad} has a config.json whose `eval_results` entry is not a list of "
                      f"{{metric_type, metric_value, dataset_name}} objects: {fix}.")
    shapes = _safetensors_shapes(path)
    if shapes is None:
        return  # no local safetensors (sharded elsewhere, or missing): transformers reports it
    expected = {"d2t": [cfg["draft_vocab_size"]]}
    if "hidden_size" in body:
        expected["lm_head.weight"] = [cfg["draft_vocab_size"], body["hidden_size"]]
    if rdk is not None:
        expected |= {"rdk_targets": [cfg["draft_vocab_size"], rdk["num_targets"]],
                     "rdk_weights": [cfg["draft_vocab_size"], rdk["num_targets"] + 1]}
    if rdk is None and ("rdk_targets" in shapes or "rdk_weights" in shapes):
        raise OSError(f"{bad}: the weights hold an RDK kernel that config.json does not announce (its `rdk` entry is "
                      f"missing): {fix}.")
    for name, shape in expected.items():
        if name in shapes and shapes[name] != shape:
            raise OSError(f"{bad}: config.json and the weights disagree ({name} is {shapes[name]} in the weights, "
                          f"{shape} by config.json): {fix}.")
    layers = {k.split(".")[2] for k in shapes if k.startswith("model.layers.")}
    if layers and "num_hidden_layers" in body and len(layers) != body["num_hidden_layers"]:
        raise OSError(f"{bad}: config.json says {body['num_hidden_layers']} layers, the weights hold {len(layers)}: "
                      f"{fix}.")
    embed = [v for k, v in shapes.items() if k.endswith("embed_tokens.weight")]
    if embed and {"vocab_size", "hidden_size"} <= set(body) and embed[0] != [body["vocab_size"], body["hidden_size"]]:
        raise OSError(f"{bad}: config.json and the weights disagree (embedding {embed[0]} vs vocab_size "
                      f"{body['vocab_size']}, hidden_size {body['hidden_size']}): {fix}.")


def _safetensors_shapes(path: str) -> dict[str, list[int]] | None:
    """Tensor shapes from the headers of a local checkpoint (no tensor is read); None without one."""
    import struct

    files = [os.path.join(path, f) for f in sorted(os.listdir(path)) if re.fullmatch(
        r"model(-\d{5}-of-\d{5})?\.safetensors", f)]
    if not files:
        return None
    shapes = {}
    for file in files:
        try:
            with open(file, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                if n > 100_000_000:
                    raise ValueError("header length out of range")
                header = json.loads(f.read(n))
            shapes |= {k: list(v["shape"]) for k, v in header.items() if k != "__metadata__"}
        except Exception as err:  # noqa: BLE001 - any damage: one line
            raise OSError(f"The drafter's weights file {file!r} is truncated or corrupt ({str(err)[:120]}): copy or "
                          "download it again, or re-save the drafter.") from None
    return shapes


def _stale_weights(name: str) -> bool:
    """Weight files of an earlier save that the new one replaces (transformers' convention: only its own
    ``model.safetensors``, its index and ``model-XXXXX-of-XXXXX.safetensors`` shards; nothing else is ours)."""
    return name in ("model.safetensors", "model.safetensors.index.json") or bool(
        re.fullmatch(r"model-\d{5}-of-\d{5}\.safetensors", name))


_RDK_KERNEL_FIX = (
    "Re-attach it with drafter.set_rdk_kernel(kernel) and save again, or drop it with set_rdk_kernel(None)."
)


def _jsonable(info: dict) -> dict:
    """Keep what config.json can hold (numbers, strings, lists, dicts)."""
    return json.loads(json.dumps(info, default=str))


AutoModelForCausalLM.register(TrimmedDrafterConfig, TrimmedDrafter, exist_ok=True)

# Ship the code with every checkpoint (auto_map + modeling.py + configuration.py), so `trust_remote_code=True` loads a
# drafter where hf_vocabspec is not installed. This module imports only torch and transformers for that reason.
TrimmedDrafter.register_for_auto_class("AutoModelForCausalLM")
