"""The drafter body's lean forward (hf_vocabspec.lean_forward, issue #36): bitwise the body's own forward on every
family it serves (padded rows, several fed positions, rollbacks, a sliding window crossed), appended in place, used
by generate only where its first call matched, restored after the call, with a power check each: a wrong lean
forward is caught by the bitwise comparison here and by generate's first-call check (which then keeps the body's own
forward, the output still exact)."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma3TextModel, LlamaModel, Qwen2Config, Qwen2Model
from transformers.cache_utils import DynamicCache

import hf_vocabspec
from hf_vocabspec import lean_forward as lf
from hf_vocabspec.generation.engine import _AlignedCache
from hf_vocabspec.modeling import cache_kwarg
from tiny import VOCAB, gemma3_config, llama_config, make_pair


def _qwen2_config():
    return Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


BODIES = {"llama": lambda: LlamaModel(llama_config()), "qwen2": lambda: Qwen2Model(_qwen2_config()),
          "gemma3": lambda: Gemma3TextModel(gemma3_config())}  # gemma3: window 4, crossed below


def _engine_cache(body):
    return _AlignedCache(DynamicCache(config=body.config)).cache  # sliding layers held whole, as the engine does


def _steps(body, lean, batch: int, dtype=torch.float32, fed=(1, 3, 1, 2, 1)):
    """Prefill (the model's own forward on both caches), then steps of ``fed`` positions: the body's own forward
    on one cache, ``lean`` on the other, each followed by a one-column rollback (the engine's ``keep``). Returns
    the (own, lean) hidden states of every step."""
    body = body.to(dtype).eval()
    g = torch.Generator().manual_seed(1)
    P = 7
    ids = torch.randint(3, VOCAB, (batch, P), generator=g)
    mask = torch.ones(batch, P, dtype=torch.long)
    if batch > 1:
        mask[0, :3] = 0  # a left-padded row
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    own_cache, lean_cache = _engine_cache(body), _engine_cache(body)
    out = []
    with torch.no_grad():
        for cache in (own_cache, lean_cache):
            body(input_ids=ids, attention_mask=mask if batch > 1 else None, position_ids=pos, use_cache=True,
                 **{cache_kwarg(body): cache})
        for m in fed:
            new = torch.randint(3, VOCAB, (batch, m), generator=g)
            mask = torch.cat([mask, torch.ones(batch, m, dtype=torch.long)], 1)
            p = pos[:, -1:] + 1 + torch.arange(m)[None]
            pos = torch.cat([pos, p], 1)
            m2 = mask if batch > 1 else None
            a = body(input_ids=new, attention_mask=m2, position_ids=p, use_cache=True,
                     **{cache_kwarg(body): own_cache}).last_hidden_state
            out.append((a, lean(body, new, m2, p, lean_cache)))
            for cache in (own_cache, lean_cache):  # one rejected column rolled back: a narrower view
                for layer in cache.layers:
                    n = layer.keys.shape[-2] - 1
                    layer.keys, layer.values = layer.keys.narrow(2, 0, n), layer.values.narrow(2, 0, n)
            mask, pos = mask[:, :-1], pos[:, :-1]
        # the lean cache appended in place: each layer's keys are the first columns of its buffer
        assert all(layer.keys.data_ptr() == layer.__dict__["_lean_keys"].data_ptr() for layer in lean_cache.layers)
    return out


@pytest.mark.parametrize("family", sorted(BODIES))
@pytest.mark.parametrize("batch", [1, 3])
def test_bitwise_the_bodys_own_forward(family, batch):
    torch.manual_seed(0)
    for own, lean in _steps(BODIES[family](), lf.lean_forward, batch):
        assert torch.equal(own, lean)


def test_bitwise_in_bfloat16():
    torch.manual_seed(0)
    for own, lean in _steps(BODIES["gemma3"](), lf.lean_forward, 3, dtype=torch.bfloat16):
        assert torch.equal(own, lean)


_LEAN = lf.lean_forward


def _shifted(body, input_ids, attention_mask, position_ids, cache):
    """A deliberately wrong lean forward: rotary positions one ahead."""
    return _LEAN(body, input_ids, attention_mask, position_ids + 1, cache)


def test_power_a_wrong_position_is_caught():
    torch.manual_seed(0)
    assert not all(torch.equal(own, lean) for own, lean in _steps(BODIES["llama"](), _shifted, 1))


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_generate_serves_the_body_lean_exactly(kind):
    target, base = make_pair(kind, seed=3, head_scale=8.0)
    drafter = hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)) + [3, 5])
    drafter.adapt_confidence_threshold = False  # the same stop both ways (an adapted one moves on timings)
    body = drafter.model
    g = torch.Generator().manual_seed(0)
    lf.CHECKED.pop(body, None)
    for _ in range(4):
        prompt = torch.randint(3, VOCAB, (1, int(torch.randint(2, 12, (1,), generator=g))), generator=g)
        kw = dict(do_sample=False, max_new_tokens=24)
        ref = target.generate(prompt, **kw)
        out = target.generate(prompt, assistant_model=drafter, **kw)
        assert torch.equal(ref, out)
        assert "forward" not in body.__dict__  # restored after the call
        lean_stats = drafter.last_speculation_stats
        drafter.use_lean_forward = False
        assert torch.equal(target.generate(prompt, assistant_model=drafter, **kw), ref)
        own_stats = drafter.last_speculation_stats
        del drafter.use_lean_forward
        # the same drafts either way (bitwise the same forward)
        assert (lean_stats.proposed, lean_stats.accepted) == (own_stats.proposed, own_stats.accepted)
        assert "lean forward" not in own_stats.kernels
    assert lf.served(body) is True
    assert "lean forward" in lean_stats.kernels


def test_generate_batched_padded_rows_exactly():
    target, base = make_pair("gemma3", seed=5, head_scale=8.0)
    drafter = hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)) + [3, 5])
    drafter.generation_config.batched_speculation = "on"
    ids = torch.tensor([[0, 0, 0, 7, 9, 11], [4, 8, 15, 16, 23, 42]])
    mask = (ids != 0).long()
    mask[1] = 1
    kw = dict(attention_mask=mask, do_sample=False, max_new_tokens=20)
    ref = target.generate(ids, **kw)
    assert torch.equal(target.generate(ids, assistant_model=drafter, **kw), ref)
    assert "lean forward" in drafter.last_speculation_stats.kernels and lf.served(drafter.model) is True


def test_power_a_wrong_lean_forward_is_not_served(monkeypatch):
    """generate's first-call check catches a lean forward that differs: the body keeps its own forward, the
    output stays exact."""
    target, base = make_pair("llama", seed=7, head_scale=8.0)
    drafter = hf_vocabspec.trim_drafter(base, range(VOCAB - 10))
    monkeypatch.setattr(lf, "lean_forward", _shifted)
    prompt = torch.tensor([[1, 6, 9, 14]])
    ref = target.generate(prompt, do_sample=False, max_new_tokens=16)
    assert torch.equal(target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=16), ref)
    assert lf.served(drafter.model) is False


# --- the stacked int8 layers and merged norms (where the fast linears chose the int8 copies) ---------------------
def _forced_int8(body, rows=None, kernel="int8"):
    """The fast linears on ``body`` as a drafter's, every layer's choice made: its int8 copy for ``rows`` (default:
    every count it is a candidate for; ``kernel``: "int8", or "int8_bf16", the copy on bfloat16 input)."""
    from torch import nn

    from hf_vocabspec import kernels

    rows = range(1, kernels.DRAFT_MAX_ROWS + 1) if rows is None else rows

    for m in body.modules():
        if type(m) is nn.Linear and "forward" in m.__dict__:
            for r in rows:
                kernels._DECIDED[kernels._fast_key(m, r, True)] = kernel


@pytest.mark.parametrize("family", ["qwen2", "gemma3"])  # q/k/v biases; q/k norms merged
@pytest.mark.parametrize("dtype,kernel", [(torch.float32, "int8"), (torch.bfloat16, "int8"),
                                          (torch.float32, "int8_bf16")])
def test_bitwise_with_stacked_int8_layers(family, dtype, kernel):
    from hf_vocabspec import kernels

    if not kernels.quantization_ops_available("int8"):
        pytest.skip("no int8 kernel in this torch")
    torch.manual_seed(0)
    body = BODIES[family]().to(dtype).eval()
    try:
        with kernels.fast_linears(draft=(body,)):
            _forced_int8(body, kernel=kernel)
            lf._PLANS.pop(body, None)
            with torch.no_grad():  # the norms' first calls (each checks its fused form against its own)
                body(input_ids=torch.tensor([[5, 6, 7]]), use_cache=False)
            pairs = _steps(body, lf.lean_forward, 3, dtype=dtype)
            plan = lf._plan(body)
            with torch.no_grad():
                assert all(layer.linears(3) is not None and layer.linears(1) is not None for layer in plan)
                # the stacked kernel's input dtype is the kernel chosen: int8_bf16's scales are bfloat16
                want = torch.bfloat16 if kernel == "int8_bf16" else dtype
                assert all(group[1].dtype == want for layer in plan for group in layer.linears(1))
            if family == "gemma3":
                assert all(layer.qk_norm is not None for layer in plan)
            for own, lean in pairs:
                assert torch.equal(own, lean)
            # the layers' own int8 copies are views of the stacked one (no second copy)
            attn = body.layers[0].self_attn
            stacked = kernels._STACKED[attn.q_proj][1][0]
            assert kernels._INT8[attn.k_proj][2].weight.data_ptr() > stacked.data_ptr()
            assert kernels._INT8[attn.k_proj][2].weight.untyped_storage().data_ptr() == \
                stacked.untyped_storage().data_ptr()
    finally:
        kernels.forget_choices()
        kernels.release(body)
        lf._PLANS.pop(body, None)


def test_layers_mixing_int8_and_int8_bf16_are_called_as_modules():
    """Layers whose linears kept different int8 kernels (float32 and bfloat16 input) are not stacked: one stacked
    call would run one of them for both (the modules run their own), and the forward stays bitwise the body's."""
    from torch import nn

    from hf_vocabspec import kernels

    if not kernels.quantization_ops_available("int8"):
        pytest.skip("no int8 kernel in this torch")
    torch.manual_seed(0)
    body = BODIES["llama"]().eval()
    try:
        with kernels.fast_linears(draft=(body,)):
            _forced_int8(body, kernel="int8_bf16")
            down = body.layers[0].mlp.down_proj
            assert type(down) is nn.Linear
            for r in range(1, 8):
                kernels._DECIDED[kernels._fast_key(down, r, True)] = "int8"
            lf._PLANS.pop(body, None)
            pairs = _steps(body, lf.lean_forward, 1)
            plan = lf._plan(body)
            with torch.no_grad():
                # (choices are keyed by shape: every layer's down projection kept "int8")
                assert all(layer.linears(1) is None for layer in plan)
            for own, lean in pairs:
                assert torch.equal(own, lean)
    finally:
        kernels.forget_choices()
        kernels.release(body)
        lf._PLANS.pop(body, None)


def test_power_a_misstacked_layer_is_caught(monkeypatch):
    """q's and k's rows stacked in the wrong order: the lean forward differs (so the first-call check refuses it)."""
    from hf_vocabspec import kernels

    if not kernels.quantization_ops_available("int8"):
        pytest.skip("no int8 kernel in this torch")
    stacked = kernels.stacked_int8
    monkeypatch.setattr(lf, "stacked_int8", lambda mods: stacked([mods[1], mods[0], *mods[2:]]))
    torch.manual_seed(0)
    body = BODIES["llama"]().eval()
    try:
        with kernels.fast_linears(draft=(body,)):
            _forced_int8(body)
            lf._PLANS.pop(body, None)
            assert not all(torch.equal(own, lean) for own, lean in _steps(body, lf.lean_forward, 1))
    finally:
        kernels.forget_choices()
        kernels.release(body)
        lf._PLANS.pop(body, None)
