"""Weight-only quantized drafters (modeling.py, ``config.weight_quantization``): the kernels compute what the
quantization says, long forwards and training run the full-precision weights, the setting survives save/load,
greedy output stays target-only's, the sampled law stays exact, and a drafter whose reported law is not the one it
drew from is caught (power)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from marginals import check_detected, check_lossless, pruned_drafter
from tiny import VOCAB, make_pair
from torch import nn

import hf_vocabspec
from hf_vocabspec import modeling
from hf_vocabspec.configuration import WEIGHT_QUANTIZATIONS
from hf_vocabspec.generation.draft_step import DraftStep

pytestmark = pytest.mark.skipif(not all(map(modeling.quantization_ops_available, WEIGHT_QUANTIZATIONS)),
                                reason="this torch lacks the weight-only CPU kernels")


@pytest.fixture(autouse=True)
def small_groups(monkeypatch):
    """The tiny models' layers are 32-64 wide: int4 groups of 32 (real drafters: 128)."""
    monkeypatch.setattr(modeling, "INT4_GROUP_SIZE", 32)


def _reference(weight: torch.Tensor, scheme: str) -> torch.Tensor:
    """What the quantization means, written out (float32): int8 round(w / s) * s with s = row amax / 127; int4
    per group of INT4_GROUP_SIZE: round((w - lo) / s) * s + lo with s = (hi - lo) / 15."""
    w = weight.detach().float()
    if scheme == "int8":
        scale = w.abs().amax(dim=1, keepdim=True) / 127
        return torch.round(w / scale).clamp(-127, 127) * scale
    groups = w.reshape(w.shape[0], -1, modeling.INT4_GROUP_SIZE)
    lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scale = (hi - lo) / 15
    return (torch.round((groups - lo) / scale).clamp(0, 15) * scale + lo).reshape_as(w)


@pytest.mark.parametrize("scheme", WEIGHT_QUANTIZATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out_features", [32, 40])  # 40: int4 pads its rows to a multiple of 16
def test_kernel_computes_the_quantized_weight(scheme, dtype, out_features):
    torch.manual_seed(0)
    layer = nn.Linear(64, out_features, bias=True).to(dtype)
    original = layer.weight.detach().clone()
    assert modeling.apply_weight_quantization([layer], scheme) == 1
    # the weights now hold the quantized values (one rounding of the scales from the formula)
    ref = _reference(original, scheme)
    err = (layer.weight.float() - ref).abs()
    if dtype == torch.float32:
        assert err.max() <= 1e-5 * ref.abs().max()
    else:  # bf16 scales and storage: an element at a rounding boundary may take the next level, never further
        step = original.float().abs().max() * (2 / 15 if scheme == "int4" else 1 / 127)
        assert err.max() <= 1.05 * step and float((err > step / 2).float().mean()) <= 0.15
    assert not torch.equal(layer.weight, original)
    for rows in (1, 3, modeling.QUANTIZED_MAX_ROWS):
        x = torch.randn(1, rows, 64).to(dtype)
        with torch.no_grad():
            out = layer(x)
        assert out.shape == (1, rows, out_features) and out.dtype == dtype
        full = F.linear(x.float(), layer.weight.float(), layer.bias.float())  # F.linear on the same values
        assert (out.float() - full).abs().max() <= (2e-2 if dtype == torch.bfloat16 else 1e-4) * full.abs().max()
        assert not torch.equal(out, F.linear(x, original, layer.bias))
    x = torch.randn(1, modeling.QUANTIZED_MAX_ROWS + 1, 64).to(dtype)  # a prompt: F.linear on the same values
    with torch.no_grad():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    x = torch.randn(1, 2, 64).to(dtype)  # training: F.linear with gradients
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    q = layer.__dict__["_vocabspec_quantized"]
    again, values = modeling.quantize_weight(layer.weight, scheme)  # re-quantizing quantized values (a load):
    torch.testing.assert_close(values.to(dtype), layer.weight.detach())  # the same, up to rounding
    torch.testing.assert_close(again.scales, q.scales)


def test_changed_weight_is_quantized_again_and_none_keeps_the_values():
    layer = nn.Linear(64, 32)
    modeling.apply_weight_quantization([layer], "int8")
    x = torch.randn(2, 64)
    with torch.no_grad():
        before = layer(x)
        layer.weight.mul_(2)
        after = layer(x)
    torch.testing.assert_close(after - layer.bias, 2 * (before - layer.bias), rtol=1e-5, atol=1e-5)
    values = layer.weight.detach().clone()
    modeling.apply_weight_quantization([layer], None)
    assert "forward" not in layer.__dict__ and "_vocabspec_quantized" not in layer.__dict__
    assert torch.equal(layer.weight, values)


def test_bad_settings_fail_early_in_one_line(tmp_path):
    _, base = make_pair("llama")
    drafter = hf_vocabspec.trim_drafter(base, range(VOCAB - 8))
    with pytest.raises(ValueError, match=r"one of \('int8', 'int4'\).*quantize_weights\(None\)"):
        drafter.quantize_weights("int3")
    assert drafter.config.weight_quantization is None and drafter.quantized_layers == 0
    drafter.save_pretrained(tmp_path / "d")
    cfg = (tmp_path / "d" / "config.json").read_text().replace('"weight_quantization": null',
                                                              '"weight_quantization": "fp8"')
    (tmp_path / "d" / "config.json").write_text(cfg)
    with pytest.raises(ValueError, match="weight_quantization must be None or one of"):
        hf_vocabspec.TrimmedDrafter.from_pretrained(tmp_path / "d")


@pytest.mark.parametrize("scheme", WEIGHT_QUANTIZATIONS)
def test_saved_drafter_loads_back_quantized(scheme, tmp_path):
    _, base = make_pair("gemma3")
    drafter = hf_vocabspec.trim_drafter(base, range(VOCAB - 8)).quantize_weights(scheme)
    assert drafter.quantized_layers > 0 and drafter.config.weight_quantization == scheme
    hidden = torch.randn(1, 1, 32)
    with torch.no_grad():
        logits = drafter.draft_logits(hidden)
    drafter.save_pretrained(tmp_path / "d")
    loaded = hf_vocabspec.TrimmedDrafter.from_pretrained(tmp_path / "d")
    assert loaded.config.weight_quantization == scheme and loaded.quantized_layers == drafter.quantized_layers
    with torch.no_grad():
        torch.testing.assert_close(loaded.draft_logits(hidden), logits)  # same copies, made at load
    assert not any("_vocabspec" in k for k in loaded.state_dict())  # plain weights (the quantized values)
    for name, weight in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], weight), name
    loaded.quantize_weights(None)  # the kernels go, the values stay
    with torch.no_grad():
        torch.testing.assert_close(loaded.draft_logits(hidden), logits, rtol=1e-4, atol=1e-4)
    assert loaded.config.weight_quantization is None and loaded.quantized_layers == 0


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
@pytest.mark.parametrize("scheme", WEIGHT_QUANTIZATIONS)
def test_greedy_identical_with_a_quantized_drafter(kind, scheme):
    target, base = make_pair(kind, seed=3, head_scale=8.0)
    drafter = hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)) + [3, 5]).quantize_weights(scheme)
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        prompt = torch.randint(3, VOCAB, (1, int(torch.randint(1, 12, (1,), generator=g))), generator=g)
        ref = target.generate(prompt, do_sample=False, max_new_tokens=24)
        out = target.generate(prompt, do_sample=False, max_new_tokens=24, assistant_model=drafter)
        assert torch.equal(ref, out), (prompt, ref, out)
    ids = torch.randint(3, VOCAB, (3, 7), generator=g)  # batched: the engine's loop at batch 3
    ref = target.generate(ids, do_sample=False, max_new_tokens=16)
    assert torch.equal(target.generate(ids, do_sample=False, max_new_tokens=16, assistant_model=drafter), ref)
    assert f"drafter {scheme} weights on {drafter.quantized_layers} layers" in drafter.last_speculation_stats.kernels


@pytest.fixture(scope="module")
def lossless_pair():
    target, drafter, probe = pruned_drafter("llama")
    return target, drafter, probe


@pytest.mark.parametrize("scheme", WEIGHT_QUANTIZATIONS)
def test_sampling_with_a_quantized_drafter_is_lossless(lossless_pair, scheme, monkeypatch):
    """Chi-square of the first two sampled tokens against the exact target marginals (marginals.py threshold),
    with the drafts drawn through the quantized kernels (counted)."""
    monkeypatch.setattr(modeling, "INT4_GROUP_SIZE", 32)
    target, drafter, probe = lossless_pair
    drafter.quantize_weights(scheme)
    calls = []
    original = modeling._quantized_forward
    monkeypatch.setattr(modeling, "_quantized_forward", lambda self, x: calls.append(1) or original(self, x))
    drafter.quantize_weights(scheme)  # re-bound to the counting forward
    try:
        check_lossless(target, drafter, {"temperature": 0.9}, pruned_probe=probe)
    finally:
        drafter.quantize_weights(None)
    assert calls


def test_a_law_other_than_the_drawn_one_is_detected(lossless_pair, monkeypatch):
    """Power: drafts drawn from the quantized drafter but reported with another law (as if q came from another
    precision's forward: here its softmax at temperature 0.5) must fail the same check."""
    target, drafter, probe = lossless_pair
    drafter.quantize_weights("int8")
    original = DraftStep.draw

    def wrong(self, logits):
        idx, probs = original(self, logits)
        return idx, (None if probs is None else (logits / 0.5).softmax(dim=-1))

    monkeypatch.setattr(DraftStep, "draw", wrong)
    try:
        check_detected(target, drafter, {"temperature": 0.9}, pruned_probe=probe)
    finally:
        drafter.quantize_weights(None)


@pytest.mark.skipif(not modeling.quantization_ops_available("int8"), reason="this torch has no int8 CPU kernel")
@pytest.mark.parametrize("wrong", [False, True], ids=["copies", "power-wrong-copies"])
def test_compiled_draft_steps_of_an_unquantized_drafter_trace_its_int8_copies(wrong, monkeypatch):
    """``compile_draft_step`` on an unquantized drafter: its body's layers run int8 copies traced into the step's
    graph (``kernels.compiled_int8_copies``, the forward of ``quantize_weights("int8")``; the eager fast linears'
    trials cannot run inside a graph), with no graph break; the output is target-only's; the compiled steps draft
    what eager steps on the same copies draft, and ``stats.kernels`` names them. Power: copies with their scales
    negated (a wrong copy) must draft otherwise, the output still target-only's."""
    from torch._dynamo.utils import counters

    from hf_vocabspec import kernels

    target, base = make_pair("llama", seed=3, head_scale=8.0)
    drafter = hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)) + [3, 5])
    body = [m for m in drafter.model.modules() if isinstance(m, nn.Linear)]
    ids = torch.randint(3, VOCAB, (1, 9), generator=torch.Generator().manual_seed(1))
    kw = dict(do_sample=False, max_new_tokens=20, assistant_model=drafter)
    ref = target.generate(ids, do_sample=False, max_new_tokens=20)
    with kernels.compiled_int8_copies(drafter.model) as traced:  # eager steps on the copies
        assert traced == len(body)
        assert torch.equal(target.generate(ids, **kw), ref)
    eager = drafter.last_speculation_stats.per_round_accepted
    if wrong:
        serve = kernels.serve_quantized
        monkeypatch.setattr(kernels, "serve_quantized",
                            lambda m, q: serve(m, None if q is None else q._replace(scales=-q.scales)))
    drafter.compile_draft_step = True
    try:
        breaks = sum(counters["graph_break"].values())
        out = target.generate(ids, **kw)
        breaks = sum(counters["graph_break"].values()) - breaks
    finally:
        drafter.compile_draft_step = False
    stats = drafter.last_speculation_stats
    assert torch.equal(out, ref), (ref.tolist(), out.tolist())
    assert stats.compiled_draft and breaks == 0, (stats.compiled_draft, breaks)
    assert f"compiled steps on int8 copies of {len(body)} layers" in stats.kernels, stats.kernels
    assert not any("_vocabspec_quantized" in m.__dict__ or "forward" in m.__dict__ for m in body)  # restored
    if wrong:
        assert stats.per_round_accepted != eager, eager
    else:
        assert stats.per_round_accepted == eager, (stats.per_round_accepted, eager)


@pytest.mark.parametrize("scheme", WEIGHT_QUANTIZATIONS)
def test_compiled_draft_steps_trace_the_int_kernels_without_breaks(scheme):
    """``compile_draft_step`` on a quantized drafter (a real Inductor compile): the int kernels are traced into the
    drafter's one graph (no graph break: a per-layer weight check there broke it 2 x layers times and ran slower than
    eager), the output is target-only's, the compiled steps draft what the eager quantized steps draft, and after
    the drafter's weights change between calls the compiled steps use int copies of the new weights
    (``refresh_weight_quantization`` at the call's start: the traced layers do not check)."""
    from torch._dynamo.utils import counters

    target, base = make_pair("llama", seed=3, head_scale=8.0)
    drafter = hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)) + [3, 5]).quantize_weights(scheme)
    ids = torch.randint(3, VOCAB, (1, 9), generator=torch.Generator().manual_seed(1))
    kw = dict(do_sample=False, max_new_tokens=20, assistant_model=drafter)
    ref = target.generate(ids, do_sample=False, max_new_tokens=20)

    def run(compiled: bool):
        drafter.compile_draft_step = compiled
        breaks = sum(counters["graph_break"].values())
        out = target.generate(ids, **kw)
        stats = drafter.last_speculation_stats
        assert torch.equal(out, ref), (ref.tolist(), out.tolist())
        assert stats.compiled_draft is compiled
        return stats.per_round_accepted, sum(counters["graph_break"].values()) - breaks

    try:
        eager, _ = run(False)
        compiled, breaks = run(True)
        assert breaks == 0 and compiled == eager, (breaks, compiled, eager)
        with torch.no_grad():  # new weights: every layer's output projections zeroed
            for layer in drafter.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.mul_(-3.0)
        compiled_after = run(True)[0]  # first: an eager call would re-derive the copies itself
        changed, _ = run(False)
        assert changed != eager  # the change moves the drafts (else the check could not fail)
        assert compiled_after == changed, (compiled_after, changed)
    finally:
        drafter.compile_draft_step = False
