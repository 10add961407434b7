"""Fast linears (kernels.py): oneDNN packed weights give F.linear's numbers up to summation order, are chosen by
measurement, run only inside hf_vocabspec generate calls (restored after, also on errors), keep greedy output and
the sampled law exact, and a wrong packed kernel is caught (power)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from marginals import check_detected, check_lossless, pruned_drafter
from tiny import VOCAB, make_pair
from torch import nn
from transformers import StoppingCriteria, StoppingCriteriaList

import hf_vocabspec
from hf_vocabspec import kernels, lean_forward

pytestmark = pytest.mark.skipif(not kernels.available(), reason="this torch build has no oneDNN")


@pytest.fixture
def packed(monkeypatch):
    """Always keep the packed kernel (tiny layers would otherwise pick by timing); count the packed calls."""
    calls = []
    original = kernels._run

    def spy(name, module, x):
        calls.append((name, x.numel() // x.shape[-1]))
        return original(name, module, x)

    monkeypatch.setattr(kernels, "MARGIN", float("inf"))
    monkeypatch.setattr(kernels, "_run", spy)
    kernels.forget_choices()
    yield calls
    kernels.forget_choices()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 6])
def test_packed_matches_f_linear(dtype, bias, rows, packed):
    layer = nn.Linear(48, 40, bias=bias).to(dtype)
    x = torch.randn(1, rows, 48).to(dtype)
    with torch.no_grad(), kernels.fast_linears(layer) as report:
        outs = [layer(x) for _ in range(2 * kernels.TRIALS + 2)]
    assert report.layers == 1 and "forward" not in layer.__dict__
    ref = F.linear(x, layer.weight, layer.bias)
    for out in outs:
        torch.testing.assert_close(out, ref, rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-5)
    assert ("packed", rows) in packed


def test_choice_is_made_by_measurement(monkeypatch):
    """F.linear is kept unless the packed kernel's median beats it by MARGIN."""
    kernels.forget_choices()
    layer = nn.Linear(16, 8)
    x = torch.randn(2, 16)
    monkeypatch.setattr(kernels, "MARGIN", 0.0)  # nothing can beat 0 x F.linear
    with torch.no_grad(), kernels.fast_linears(layer):
        for _ in range(2 * (kernels.TRIALS + 1)):
            layer(x)
    (choice,) = kernels.choices()
    assert choice.chosen == "linear" and choice.speedup == 1.0
    # no packed time can beat 0 x any F.linear time: decided after EARLY timed calls each, not TRIALS
    assert all(len(t) == kernels.EARLY for t in choice.timings_ms.values())
    kernels.forget_choices()


def _trial(times: dict[str, list[float]], trials=5, margin=0.9, early=2) -> tuple[str | None, int]:
    """Feed alternating timed calls to a KernelChoice; return its choice and how many calls it took."""
    choice = kernels.KernelChoice(kernels.KernelKey("cpu", "float32", 8, 16, False, 2, 1),
                                  timings_ms={name: [] for name in times})
    calls = 0
    for i in range(max(map(len, times.values()))):
        for name in times:
            if choice.chosen is None and i < len(times[name]):
                choice.record(name, times[name][i], trials, margin, early)
                calls += 1
    return choice.chosen, calls


def test_a_clear_choice_is_made_early_and_an_unclear_one_by_medians():
    # separated: packed always beats every F.linear time by the margin -> packed after 2 each
    assert _trial({"linear": [10, 11, 12, 10, 10], "packed": [4, 5, 4, 4, 4]}) == ("packed", 4)
    # separated the other way -> F.linear after 2 each
    assert _trial({"linear": [4, 5, 4, 4, 4], "packed": [10, 11, 12, 10, 10]}) == ("linear", 4)
    # overlapping (one slow packed call): the medians decide after TRIALS each, as without the early rule
    assert _trial({"linear": [10, 10, 10, 10, 10], "packed": [4, 12, 4, 4, 4]}) == ("packed", 10)
    # packed never beats F.linear by the margin (5% faster): F.linear early, as the medians would keep it
    assert _trial({"linear": [10, 10, 10, 10, 10], "packed": [9.5, 9.5, 9.5, 9.5, 9.5]}) == ("linear", 4)
    # straddling the margin: no early decision; the medians keep F.linear
    assert _trial({"linear": [10, 10, 10, 10, 10], "packed": [8.5, 9.5, 9.5, 9.5, 9.5]}) == ("linear", 10)
    # early=None: the old rule, TRIALS each whatever the times
    assert _trial({"linear": [10] * 5, "packed": [4] * 5}, early=None) == ("packed", 10)


def test_two_close_fast_kernels_wait_for_their_full_trials():
    """With three candidates, the early rule decides only where the best's times do not overlap the other fast
    kernel's either: two kernels level on two calls each (as packed and int8 were on pair Q's drafter) are decided
    by the medians of TRIALS calls, not by a median of two."""
    # both far ahead of F.linear, overlapping each other on the first two calls: the medians pick int8 after 5 each
    assert _trial({"linear": [10] * 5, "packed": [4.0, 5.0, 5, 5, 5], "int8": [4.5, 4.6, 3, 3, 3]}) == ("int8", 15)
    # separated from each other too: decided early (2 each)
    assert _trial({"linear": [10] * 5, "packed": [5.0, 5.1, 5, 5, 5], "int8": [3.0, 3.1, 3, 3, 3]}) == ("int8", 6)


def test_rows_are_keyed_exactly_up_to_16_then_share_a_choice_by_bucket():
    assert [kernels.rows_bucket(r) for r in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64)] == [
        1, 2, 3, 4, 5, 8, 9, 16, 32, 32, 64, 64]
    kernels.forget_choices()
    layer = nn.Linear(16, 8)
    with torch.no_grad(), kernels.fast_linears(layer):
        for rows in (3, 4, 17, 20, 32):
            layer(torch.randn(rows, 16))
    # 3 and 4 rows each get their own trial (a choice made on 3 rows is not imposed on 4); 17-32 share one
    assert sorted(c.key.rows for c in kernels.choices()) == [3, 4, 32]
    kernels.forget_choices()


def test_a_choice_for_one_count_is_not_used_for_another(monkeypatch):
    # the kept kernel of 3 rows must not decide 4 rows: a slow F.linear on 4 rows alone is found by 4 rows' trial
    kernels.forget_choices()
    layer = nn.Linear(16, 8)
    real = kernels._run
    ticks = iter(range(10**6))

    def run(name, module, x):  # F.linear "fast" on 3 rows, "slow" on 4 (time moves by the fake clock)
        out = real(name, module, x)
        rows = x.shape[0]
        slow = (name == "linear") == (rows == 4)
        for _ in range(100 if slow else 1):
            next(ticks)
        return out

    monkeypatch.setattr(kernels, "_run", run)
    monkeypatch.setattr(kernels.time, "perf_counter", lambda: next(ticks) * 1e-3)
    with torch.no_grad(), kernels.fast_linears(layer):
        for rows in (3,) * 12 + (4,) * 12:
            layer(torch.randn(rows, 16))
    chosen = {c.key.rows: c.chosen for c in kernels.choices()}
    kernels.forget_choices()
    assert chosen == {3: "linear", 4: "packed"}


def test_settle_choices_decides_every_layer_at_each_count_before_timing():
    target, _ = make_pair()
    kernels.forget_choices()
    shapes = {(m.out_features, m.in_features, m.bias is not None) for m in target.modules() if type(m) is nn.Linear}
    ran = kernels.settle_choices(target, [1, 3])
    decided = {(c.key.out_features, c.key.in_features, c.key.bias, c.key.rows) for c in kernels.choices()
               if c.chosen is not None}
    assert ran >= 2
    assert decided == {(*shape, rows) for shape in shapes for rows in (1, 3)}
    assert kernels.settle_choices(target, [1, 3]) == 0  # settled: no more forwards
    assert all("forward" not in m.__dict__ for m in target.modules())  # the swap is restored
    kernels.forget_choices()


def test_settle_choices_runs_nothing_where_the_copies_do_not_fit(monkeypatch):
    target, _ = make_pair()
    kernels.forget_choices()
    kernels.release()
    monkeypatch.setattr(kernels, "_available_bytes", lambda: 1000)
    assert kernels.settle_choices(target, [1, 2]) == 0
    assert kernels.choices() == []


def test_the_trial_counter_moves_with_trials_and_stops_once_decided():
    kernels.forget_choices()
    layer = nn.Linear(16, 8)
    before = kernels.trials_run()
    try:
        with torch.no_grad(), kernels.fast_linears(layer):
            for _ in range(2 * (kernels.TRIALS + 1)):
                layer(torch.randn(3, 16))
            moved = kernels.trials_run()
            assert moved > before and all(c.chosen is not None for c in kernels.choices())
            layer(torch.randn(3, 16))  # decided: no trial
            assert kernels.trials_run() == moved
    finally:
        kernels.forget_choices()


def test_skipped_where_it_cannot_apply(packed):
    layer = nn.Linear(16, 8)
    with kernels.fast_linears(layer):
        layer(torch.randn(3, 16))  # autograd: F.linear
        with torch.no_grad():
            layer(torch.randn(kernels.MAX_ROWS + 1, 16))  # prefill-sized
            layer.double()(torch.randn(2, 16).double())  # a dtype oneDNN does not pack
    assert packed == []


def test_a_changed_weight_is_packed_again(packed):
    layer = nn.Linear(16, 8, bias=False)
    x = torch.randn(2, 16)
    with torch.no_grad(), kernels.fast_linears(layer):
        layer(x), layer(x)
        layer.weight.mul_(2.0)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
    kernels.release(layer)
    assert layer not in kernels._PACKED


def test_refused_when_the_copies_would_not_fit(monkeypatch):
    layer = nn.Linear(64, 64)
    monkeypatch.setattr(kernels, "_available_bytes", lambda: 1000)
    kernels.release(layer)
    with kernels.fast_linears(layer) as report:
        assert report.layers == 0 and "GiB available" in str(report)
        assert "forward" not in layer.__dict__


def test_models_that_fit_are_packed_in_the_order_given(monkeypatch):
    """Target first: when both models' copies would not fit, the first model's layers are packed and the second's
    keep F.linear (whole models; a generate call's verify of several rows gains most). Power: in the other order the
    other model is the one packed."""
    big, small = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)), nn.Linear(32, 32)
    bytes_big = 2 * 64 * 64 * 4
    monkeypatch.setattr(kernels, "_available_bytes", lambda: int(bytes_big / kernels.MEMORY_SHARE) + 100)
    for model in (big, small):
        kernels.release(model)
    with kernels.fast_linears(big, small) as report:
        assert report.layers == 2 and all("forward" in m.__dict__ for m in big)
        assert "forward" not in small.__dict__ and "would not fit" in str(report)
    assert not any("forward" in m.__dict__ for m in (*big, small))
    with kernels.fast_linears(small, big) as report:  # small fits first, then big no longer does
        assert report.layers == 1 and "forward" in small.__dict__ and "forward" not in big[0].__dict__


def test_restored_on_error_and_disabled_switch(packed):
    layer = nn.Linear(8, 8)
    with pytest.raises(RuntimeError, match="boom"), kernels.fast_linears(layer):
        assert "forward" in layer.__dict__
        raise RuntimeError("boom")
    assert "forward" not in layer.__dict__
    with kernels.fast_linears(layer, enabled=False) as report:
        assert report.layers == 0 and "forward" not in layer.__dict__


# --- inside generate ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_greedy_identical_with_fast_linears(kind, packed, monkeypatch):
    target, base = make_pair(kind, seed=3, head_scale=8.0)
    drafter = hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)) + [3, 5])
    g = torch.Generator().manual_seed(0)
    for _ in range(6):
        prompt = torch.randint(3, VOCAB, (1, int(torch.randint(1, 12, (1,), generator=g))), generator=g)
        ref = target.generate(prompt, do_sample=False, max_new_tokens=30)
        packed.clear()
        out = target.generate(prompt, do_sample=False, max_new_tokens=30, assistant_model=drafter)
        assert torch.equal(ref, out), (prompt, ref, out)
        assert any(name == "packed" and rows > 1 for name, rows in packed)  # the target's verify forwards
        assert all("forward" not in m.__dict__ for m in target.modules())  # restored after the call
        assert all("forward" not in m.__dict__ for m in drafter.modules())
    assert drafter.last_speculation_stats.kernels.startswith("fast linears on")
    # the drafter's RMSNorms ran F.rms_norm, each checked bitwise against its own forward
    assert "RMSNorms fused" in drafter.last_speculation_stats.kernels
    assert all(kernels._NORMS[m][3] for m in _norms(drafter))
    # the switch: use_fused_norms = False leaves them to their modules (the same output; the linears still fast)
    kernels.release()
    drafter.use_fused_norms = False
    calls = []
    rms_norm = F.rms_norm
    monkeypatch.setattr(F, "rms_norm", lambda *a, **k: calls.append(1) or rms_norm(*a, **k))
    assert torch.equal(target.generate(prompt, do_sample=False, max_new_tokens=30, assistant_model=drafter), ref)
    kernels_line = drafter.last_speculation_stats.kernels
    assert kernels_line.startswith("fast linears on") and "RMSNorms" not in kernels_line
    assert not calls and not kernels._NORMS


def test_switch_off_and_error_restore(packed):
    target, base = make_pair("llama", seed=7, head_scale=8.0)
    drafter = hf_vocabspec.trim_drafter(base, range(VOCAB - 10))
    prompt = torch.tensor([[1, 6, 9, 14]])
    drafter.use_fast_linears = False
    target.generate(prompt, do_sample=False, max_new_tokens=8, assistant_model=drafter)
    assert packed == [] and drafter.last_speculation_stats.kernels == "F.linear (off); the drafter's body through the lean forward"
    del drafter.use_fast_linears

    class Explode(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        target.generate(prompt, do_sample=False, max_new_tokens=8, assistant_model=drafter,
                        stopping_criteria=StoppingCriteriaList([Explode()]))
    assert packed and all("forward" not in m.__dict__ for m in (*target.modules(), *drafter.modules()))


@pytest.fixture(scope="module")
def lossless_pair():
    return pruned_drafter("llama")


def test_sampling_with_fast_linears_is_lossless(lossless_pair, packed):
    """Chi-square of the first two sampled tokens against the exact target marginals (marginals.py threshold)."""
    target, drafter, probe = lossless_pair
    check_lossless(target, drafter, {"temperature": 0.9}, pruned_probe=probe)
    assert any(name == "packed" and rows == 3 for name, rows in packed)  # L=2: verify forwards of 3 rows


def test_wrong_packed_kernel_is_detected(lossless_pair, monkeypatch, packed):
    """Power: a packed kernel whose multi-row output is wrong (rows of the batch mixed up) must fail."""
    target, drafter, probe = lossless_pair
    original = kernels._run

    def wrong(name, module, x):
        out = original(name, module, x)
        return out.roll(1, dims=-2) if name == "packed" and x.numel() // x.shape[-1] > 1 else out

    monkeypatch.setattr(kernels, "_run", wrong)
    check_detected(target, drafter, {"temperature": 0.9}, pruned_probe=probe)


# --- int8 copies: one more candidate for a drafter's layers ----------------------------------------------------
int8_kernel = pytest.mark.skipif(not hf_vocabspec.modeling.quantization_ops_available("int8"),
                                 reason="this torch has no int8 CPU kernel")


def _kernel_calls(monkeypatch, calls: list | None = None) -> list:
    """From now on, every kernel call recorded as (module, name, rows) (in ``calls`` where given), and ``MARGIN``
    infinite: a key keeps its fastest candidate other than ``F.linear`` (tiny layers would otherwise pick by
    timing)."""
    calls = [] if calls is None else calls
    original = kernels._run

    def spy(name, module, x):
        calls.append((module, name, x.numel() // x.shape[-1]))
        return original(name, module, x)

    monkeypatch.setattr(kernels, "MARGIN", float("inf"))
    monkeypatch.setattr(kernels, "_run", spy)
    kernels.forget_choices()
    return calls


class _Calls(list):
    kernel = "int8"  # the int8 kernel the ``int8`` fixture leaves a drafter's layers


@pytest.fixture
def int8(monkeypatch, request):
    """A drafter's layers keep their int8 copy (``packed`` is taken out of their candidates so the choice cannot fall
    on it): "int8", or where a test passes it indirectly "int8_bf16" (the copy on bfloat16 input; float32 layers
    only); every kernel call recorded (``_kernel_calls``; ``.kernel`` names the kernel)."""
    calls = _kernel_calls(monkeypatch, _Calls())
    calls.kernel = getattr(request, "param", "int8")
    monkeypatch.setattr(kernels, "DRAFT_CANDIDATES", ("linear", calls.kernel))
    yield calls
    kernels.forget_choices()


@int8_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_int8_copy_computes_the_quantized_weight_and_leaves_the_weight_alone(dtype, bias, int8):
    from hf_vocabspec.modeling import quantize_weight

    MAX = kernels.DRAFT_MAX_ROWS  # a batch's draft step: B rows x the 1-2 tokens each feeds
    layer = nn.Linear(64, 40, bias=bias).to(dtype)
    weight = layer.weight.detach().clone()
    values = quantize_weight(layer.weight, "int8")[1].to(dtype)
    with torch.no_grad(), kernels.fast_linears(draft=(layer,)) as report:
        assert report.layers == report.draft_layers == 1
        for rows in (1, 3, 8, MAX, MAX + 1):
            x = torch.randn(1, rows, 64).to(dtype)
            outs = [layer(x) for _ in range(2 * kernels.TRIALS + 2)]
            want = F.linear(x, values if rows <= MAX else weight, layer.bias)
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(outs[-1], want, rtol=tol, atol=tol)
        assert torch.equal(layer.weight, weight)  # a copy: the weight keeps its values
    ran = {(name, rows) for _, name, rows in int8}
    assert {("int8", 1), ("int8", 3), ("int8", 8), ("int8", MAX)} <= ran
    assert not any(name == "int8" and rows > MAX for name, rows in ran)
    with torch.no_grad(), kernels.fast_linears(layer):  # not a drafter's layer: never its int8 copy
        int8.clear()
        for _ in range(2 * kernels.TRIALS + 2):
            layer(torch.randn(2, 64).to(dtype))
    assert int8 and all(name != "int8" for _, name, _ in int8)


@int8_kernel
def test_a_changed_weight_gets_a_new_int8_copy(int8):
    layer = nn.Linear(32, 16)
    x = torch.randn(1, 32)
    with torch.no_grad(), kernels.fast_linears(draft=(layer,)):
        for _ in range(2 * kernels.TRIALS + 2):
            layer(x)
        layer.weight.mul_(2.0)
        after = layer(x)
    from hf_vocabspec.modeling import quantize_weight

    torch.testing.assert_close(after, F.linear(x, quantize_weight(layer.weight, "int8")[1], layer.bias))


@int8_kernel
@pytest.mark.parametrize("int8", ["int8", "int8_bf16"], indirect=True)
@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_greedy_identical_with_int8_copies_and_the_target_never_runs_them(kind, int8):
    target, base = make_pair(kind, seed=3, head_scale=8.0)
    drafter = hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)) + [3, 5])
    target_layers = {id(m) for m in target.modules()}
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        prompt = torch.randint(3, VOCAB, (1, int(torch.randint(1, 12, (1,), generator=g))), generator=g)
        ref = target.generate(prompt, do_sample=False, max_new_tokens=24)
        assert torch.equal(target.generate(prompt, do_sample=False, max_new_tokens=24, assistant_model=drafter), ref)
    ids = torch.randint(3, VOCAB, (3, 7), generator=g)  # batched: the engine's loop at batch 3
    ref = target.generate(ids, do_sample=False, max_new_tokens=16)
    assert torch.equal(target.generate(ids, do_sample=False, max_new_tokens=16, assistant_model=drafter), ref)
    ran = int8.kernel
    assert any(name == ran for m, name, _ in int8 if id(m) not in target_layers)  # the drafter drafted with them
    assert not any(name.startswith("int8") for m, name, _ in int8 if id(m) in target_layers)
    assert "with int8 copies as candidates" in drafter.last_speculation_stats.kernels
    assert lean_forward.served(drafter.model)  # its stacked int8 layers matched its own forward bitwise
    int8.clear()
    drafter.use_int8_copies = False  # the switch: the drafter's layers keep the exact candidates
    target.generate(ids, do_sample=False, max_new_tokens=8, assistant_model=drafter)
    assert int8 and not any(name.startswith("int8") for _, name, _ in int8)
    assert "int8" not in drafter.last_speculation_stats.kernels


@int8_kernel
@pytest.mark.parametrize("int8", ["int8", "int8_bf16"], indirect=True)
def test_sampling_with_int8_copies_is_lossless(lossless_pair, int8):
    """Chi-square of the first two sampled tokens against the exact target marginals (marginals.py threshold),
    with the drafts drawn through the drafter's int8 copies (counted)."""
    target, drafter, probe = lossless_pair
    check_lossless(target, drafter, {"temperature": 0.9}, pruned_probe=probe)
    assert any(name == int8.kernel for _, name, _ in int8)


@int8_kernel
@pytest.mark.parametrize("int8", ["int8", "int8_bf16"], indirect=True)
def test_a_law_other_than_the_int8_drawn_one_is_detected(lossless_pair, monkeypatch, int8):
    """Power: drafts drawn through the int8 copies but reported with another law (their softmax at temperature 0.5)
    must fail the same check."""
    from hf_vocabspec.generation.draft_step import DraftStep

    target, drafter, probe = lossless_pair
    original = DraftStep.draw

    def wrong(self, logits):
        idx, probs = original(self, logits)
        return idx, (None if probs is None else (logits / 0.5).softmax(dim=-1))

    monkeypatch.setattr(DraftStep, "draw", wrong)
    check_detected(target, drafter, {"temperature": 0.9}, pruned_probe=probe)
    assert any(name == int8.kernel for _, name, _ in int8)


@int8_kernel
@pytest.mark.parametrize("int8", ["int8_bf16"], indirect=True)
@pytest.mark.parametrize("bias", [False, True])
def test_int8_bf16_runs_the_int8_copy_on_bfloat16_input_for_float32_layers_only(bias, int8):
    """A float32 drafter layer's "int8_bf16": its int8 copy times the input rounded to bfloat16, with its scales in
    bfloat16, each sum rounded to bfloat16 (the kernel's output dtype), then widened and the bias added in float32.
    A bfloat16 layer never trials it (its "int8" is that kernel); a target's layer never."""
    from hf_vocabspec.modeling import quantize_weight

    layer = nn.Linear(64, 40, bias=bias)
    q = quantize_weight(layer.weight, "int8")[0]
    x = _rows_of_every_size(3, 64, torch.float32)
    with torch.no_grad(), kernels.fast_linears(draft=(layer,)):
        outs = [layer(x) for _ in range(2 * kernels.TRIALS + 2)]
    values = q.weight.double() * q.scales.to(torch.bfloat16).double()[:, None]
    want = (x.to(torch.bfloat16).double() @ values.T).to(torch.bfloat16).float()  # sums exact, rounded once
    sums = outs[-1] - layer.bias if bias else outs[-1]
    torch.testing.assert_close(sums, want, rtol=2**-8, atol=1e-6)  # within one bfloat16 rounding of the sums
    if not bias:  # power: a kernel left on float32 input or output has sums bfloat16 cannot hold
        assert torch.equal(sums, sums.to(torch.bfloat16).float())
        assert not torch.equal(sums, kernels.int8_linear(x, q.weight, q.scales))
    assert {(name, rows) for _, name, rows in int8} == {("linear", 3), ("int8_bf16", 3)}
    assert kernels.decided_int8(layer, 3) is None  # (outside the block the layer is no drafter's)
    int8.clear()
    with torch.no_grad(), kernels.fast_linears(draft=(layer,)):
        assert kernels.decided_int8(layer, 3).scales.dtype == torch.bfloat16  # what the lean forward stacks
        for rows in (1, kernels.DRAFT_MAX_ROWS + 1):
            for _ in range(2 * kernels.TRIALS + 2):
                layer(x[:, :1].expand(1, rows, 64))
    assert not any(name == "int8_bf16" and rows > kernels.DRAFT_MAX_ROWS for _, name, rows in int8)
    half = nn.Linear(64, 40, bias=bias).to(torch.bfloat16)
    int8.clear()
    with torch.no_grad(), kernels.fast_linears(draft=(half,)), kernels.fast_linears(layer):
        for _ in range(2 * kernels.TRIALS + 2):
            half(x.to(torch.bfloat16))
            layer(x)
    assert int8 and not any(name == "int8_bf16" for _, name, _ in int8)


def test_w8a8_is_trialled_only_where_the_int8_gemm_pays(monkeypatch):
    """The probe: torch's int8 GEMM timed against float32's once per process; w8a8 is a prefill candidate only
    where it is not slower (a slow one, as on CPUs without VNNI, would cost every trial seconds)."""
    import time as _time

    monkeypatch.setattr(kernels, "_INT8_GEMM_PAYS", None)
    assert isinstance(kernels.int8_gemm_pays(), bool)
    slow = torch._int_mm

    def sluggish(a, b):
        _time.sleep(0.05)
        return slow(a, b)

    monkeypatch.setattr(kernels, "_INT8_GEMM_PAYS", None)
    monkeypatch.setattr(torch, "_int_mm", sluggish)
    assert kernels.int8_gemm_pays() is False
    assert "w8a8" not in kernels._prefill_candidates(torch.float32)
    assert kernels._prefill_candidates(torch.bfloat16) == ("linear", "float32")
    monkeypatch.setattr(kernels, "_INT8_GEMM_PAYS", True)
    assert kernels._prefill_candidates(torch.float32) == ("linear", "w8a8")
    monkeypatch.setattr(kernels, "_INT8_GEMM_PAYS", None)
    monkeypatch.delattr(torch, "_int_mm")
    assert kernels.int8_gemm_pays() is False


@int8_kernel
@pytest.mark.parametrize("pays", [True, False], ids=["narrow-pays", "power-float32"])
def test_compiled_int8_copies_of_float32_layers_run_on_bf16_input_where_it_pays(pays, monkeypatch):
    """The compiled steps' copies (``compiled_int8_copies``) cannot trial "int8" against "int8_bf16" per layer as
    the eager fast linears do: a float32 layer's copy takes bfloat16 scales (its input rounded to bfloat16, the
    product widened back) where the once-per-process probe finds that form faster, else its float32 scales; the
    layer's output is then exactly that form's (the "int8_bf16" kernel's or the "int8" one's)."""
    monkeypatch.setattr(kernels, "_NARROW_INT8_PAYS", pays)
    layer = nn.Linear(64, 32)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), kernels.compiled_int8_copies(nn.Sequential(layer)) as served:
        assert served == 1
        copy = kernels._int8(layer)
        scales = copy.scales.to(torch.bfloat16) if pays else copy.scales
        assert layer.__dict__["_vocabspec_quantized"].scales.dtype == scales.dtype
        out = layer(x)
        assert out.dtype == torch.float32 and torch.equal(out, kernels.int8_linear(x, copy.weight, scales, layer.bias))
    assert "_vocabspec_quantized" not in layer.__dict__  # restored


@int8_kernel
def test_the_narrow_int8_probe_picks_the_faster_form(monkeypatch):
    """The probe times the int8 kernel on float32 input against bfloat16 input once per process: a form made slow
    loses."""
    import time as _time

    real = kernels.int8_linear

    def slow_when(dtype):
        def run(x, weight, scales, bias=None):
            if scales.dtype == dtype:
                _time.sleep(0.02)
            return real(x, weight, scales, bias)
        return run

    for slow, expected in ((torch.bfloat16, False), (torch.float32, True)):
        monkeypatch.setattr(kernels, "_NARROW_INT8_PAYS", None)
        monkeypatch.setattr(kernels, "int8_linear", slow_when(slow))
        assert kernels.narrow_int8_pays() is expected
    monkeypatch.setattr(kernels, "int8_linear", real)
    monkeypatch.setattr(kernels, "_NARROW_INT8_PAYS", None)
    assert isinstance(kernels.narrow_int8_pays(), bool)


# --- the fast prefill: a drafter's forwards past MAX_ROWS rows trial w8a8 and (bf16) float32 kernels --------------
@pytest.fixture
def prefill(monkeypatch):
    """A drafter's prefill keys keep the one candidate a test names (it sets ``kernels.PREFILL_CANDIDATES`` to
    ("linear", name)); every kernel call recorded (``_kernel_calls``)."""
    calls = _kernel_calls(monkeypatch)
    monkeypatch.setattr(kernels, "_INT8_GEMM_PAYS", True)  # (what w8a8 computes, whether or not it pays here)
    yield calls
    kernels.forget_choices()
    kernels.release()


def _w8a8_reference(x, layer):
    """What w8a8_linear must compute: the int8 copy's values times x quantized per row (its largest magnitude to
    127, in float32), the integer sums exact (float64), scaled back in float32, then x's dtype."""
    from hf_vocabspec.modeling import quantize_weight

    q = quantize_weight(layer.weight, "int8")[0]
    flat = x.reshape(-1, x.shape[-1]).float()
    step = flat.abs().amax(dim=1, keepdim=True) / 127
    sums = (torch.round(flat / step).double() @ q.weight.double().T).float()  # (exact: small integers)
    y = sums * step * q.scales.float()
    if layer.bias is not None:
        y = y + layer.bias.float()
    return y.to(x.dtype).reshape(*x.shape[:-1], -1)


def _rows_of_every_size(rows, width, dtype):
    """Inputs whose rows differ in magnitude by up to 1e4 (a per-tensor scale would lose the small ones)."""
    x = torch.randn(1, rows, width) * torch.logspace(-2, 2, rows)[None, :, None]
    return x.to(dtype)


@int8_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_a_drafters_prefill_in_w8a8_quantizes_each_row_and_no_one_elses(dtype, bias, prefill, monkeypatch):
    monkeypatch.setattr(kernels, "PREFILL_CANDIDATES", ("linear", "w8a8"))
    rows = kernels.MAX_ROWS + 37
    layer = nn.Linear(48, 40, bias=bias).to(dtype)
    weight = layer.weight.detach().clone()
    x = _rows_of_every_size(rows, 48, dtype)
    with torch.no_grad(), kernels.fast_linears(draft=(layer,)):
        outs = [layer(x) for _ in range(2 * kernels.TRIALS + 2)]
    assert torch.equal(outs[-1], _w8a8_reference(x, layer))
    assert not torch.equal(outs[-1], F.linear(x, layer.weight, layer.bias))  # not the weights' own product
    assert torch.equal(layer.weight, weight)  # the int8 copy is a copy
    assert {name for _, name, r in prefill if r == rows} == {"linear", "w8a8"}  # trialled, then kept
    # no one else's: a target's layer of the same rows, a drafter's of MAX_ROWS rows or fewer, the switch off
    prefill.clear()
    with torch.no_grad(), kernels.fast_linears(layer):
        for _ in range(2 * kernels.TRIALS + 2):
            layer(x)
    with torch.no_grad(), kernels.fast_linears(draft=(layer,)):
        for _ in range(2 * kernels.TRIALS + 2):
            layer(x[:, : kernels.MAX_ROWS])
    with torch.no_grad(), kernels.fast_linears(draft=(layer,), prefill=False):
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert prefill and all(name not in ("w8a8", "float32") for _, name, _ in prefill)
    assert not kernels._NO_PREFILL  # restored on exit


@int8_kernel
def test_a_w8a8_kernel_with_one_scale_for_all_rows_is_caught(prefill, monkeypatch):
    """Power: the comparison above fails for a kernel that quantizes the whole input with one scale."""
    monkeypatch.setattr(kernels, "PREFILL_CANDIDATES", ("linear", "w8a8"))

    def one_scale(x, weight, scales, bias=None):
        flat = x.reshape(-1, x.shape[-1]).float()
        step = flat.abs().amax() / 127
        y = torch._int_mm(torch.round(flat / step).to(torch.int8), weight.t()).float() * step * scales.float()
        return (y if bias is None else y + bias.float()).to(x.dtype).reshape(*x.shape[:-1], -1)

    monkeypatch.setattr(kernels, "w8a8_linear", one_scale)
    layer = nn.Linear(48, 40)
    x = _rows_of_every_size(kernels.MAX_ROWS + 1, 48, torch.float32)
    with torch.no_grad(), kernels.fast_linears(draft=(layer,)):
        outs = [layer(x) for _ in range(2 * kernels.TRIALS + 2)]
    assert not torch.equal(outs[-1], _w8a8_reference(x, layer))


@pytest.mark.parametrize("bias", [False, True])
def test_a_drafters_bf16_prefill_widened_runs_float32_sums_rounded_once(bias, prefill, monkeypatch):
    monkeypatch.setattr(kernels, "PREFILL_CANDIDATES", ("linear", "float32"))
    rows = kernels.MAX_ROWS + 37
    layer = nn.Linear(48, 40, bias=bias).to(torch.bfloat16)
    weight = layer.weight.detach().clone()
    x = torch.randn(1, rows, 48).to(torch.bfloat16)
    want = F.linear(x.float(), weight.float(), None if layer.bias is None else layer.bias.float()).to(torch.bfloat16)
    with torch.no_grad(), kernels.fast_linears(draft=(layer,)):
        outs = [layer(x) for _ in range(2 * kernels.TRIALS + 2)]
    assert torch.equal(outs[-1], want)  # bitwise: the same float32 product, rounded once
    assert torch.equal(layer.weight, weight)
    assert {name for _, name, r in prefill if r == rows} == {"linear", "float32"}
    assert [c.key.rows for c in kernels.choices() if c.chosen == "float32"] == [kernels.rows_bucket(rows)]
    kernels.release()  # (its buffer is made again, here in inference mode, and reused outside it)
    with torch.inference_mode(), kernels.fast_linears(draft=(layer,)):
        assert torch.equal(layer(x), want)
    with torch.no_grad(), kernels.fast_linears(draft=(layer,)):
        assert torch.equal(layer(x), want)
    # a float32 drafter layer has nothing to widen (and here no other candidate): F.linear, untouched, and the report
    # does not claim a fast prefill
    prefill.clear()
    other = nn.Linear(48, 40, bias=bias)
    with torch.no_grad(), kernels.fast_linears(draft=(other,)) as report:
        assert report.draft_layers == 1 and not report.fast_prefill
        for _ in range(2 * kernels.TRIALS + 2):
            assert torch.equal(other(x.float()), F.linear(x.float(), other.weight, other.bias))
    assert not prefill and not any(c.key.dtype == "float32" for c in kernels.choices())


def test_a_wrong_widened_kernel_is_caught(prefill, monkeypatch):
    """Power: the comparison above fails for a widened kernel that drops the bias."""
    monkeypatch.setattr(kernels, "PREFILL_CANDIDATES", ("linear", "float32"))
    layer = nn.Linear(48, 40).to(torch.bfloat16)
    x = torch.randn(1, kernels.MAX_ROWS + 1, 48).to(torch.bfloat16)
    monkeypatch.setattr(kernels, "widened_linear", lambda x, w, b=None: F.linear(x.float(), w.float()).to(x.dtype))
    with torch.no_grad(), kernels.fast_linears(draft=(layer,)):
        outs = [layer(x) for _ in range(2 * kernels.TRIALS + 2)]
    want = F.linear(x.float(), layer.weight.float(), layer.bias.float()).to(torch.bfloat16)
    assert not torch.equal(outs[-1], want)


@int8_kernel
@pytest.mark.parametrize("kind", ["llama", "gemma3"])
@pytest.mark.parametrize("kernel", ["w8a8", "float32"])
def test_greedy_identical_with_a_drafters_fast_prefill(kind, kernel, prefill, monkeypatch):
    monkeypatch.setattr(kernels, "PREFILL_CANDIDATES", ("linear", kernel))
    target, base = make_pair(kind, seed=3, head_scale=8.0)
    drafter = hf_vocabspec.trim_drafter(base.to(torch.bfloat16), list(range(0, VOCAB, 2)) + [3, 5])
    target_layers = {id(m) for m in target.modules()}
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, VOCAB, (1, kernels.MAX_ROWS + 20), generator=g)  # a prefill past MAX_ROWS
    ref = target.generate(prompt, do_sample=False, max_new_tokens=12)
    for _ in range(2):  # the first call trials; the second runs the kept kernel (on the lean forward's stacked copies)
        prefill.clear()
        assert torch.equal(target.generate(prompt, do_sample=False, max_new_tokens=12, assistant_model=drafter), ref)
        assert any(name == kernel and rows > kernels.MAX_ROWS for m, name, rows in prefill
                   if id(m) not in target_layers)
    assert not any(name == kernel for m, name, _ in prefill if id(m) in target_layers)
    prefill.clear()
    drafter.use_fast_prefill = False  # the switch: the drafter's prefill runs F.linear, the output the same
    assert torch.equal(target.generate(prompt, do_sample=False, max_new_tokens=12, assistant_model=drafter), ref)
    assert prefill and not any(name == kernel for _, name, _ in prefill)
    assert not kernels._NO_PREFILL  # restored on exit
    assert "for prefills" not in drafter.last_speculation_stats.kernels
    del drafter.use_fast_prefill
    target.generate(prompt, do_sample=False, max_new_tokens=2, assistant_model=drafter)
    assert "with int8 copies as candidates (w8a8 / float32 for prefills)" in drafter.last_speculation_stats.kernels


# --- the drafter's RMSNorms through F.rms_norm ---------------------------------------------------------------------
def _norms(model):
    return [m for m in model.modules() if type(m).__name__ in kernels._NORM_STYLES]


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_drafters_norms_run_fused_bitwise_their_own_and_the_targets_never(kind, dtype, monkeypatch):
    target, drafter = (m.to(dtype) for m in make_pair(kind))
    with torch.no_grad():  # a weight away from its init (Gemma's zeros, Llama's ones) so the scale is really used
        for m in _norms(drafter):
            m.weight.add_(0.1 * torch.randn_like(m.weight))
    fused_calls = []
    rms_norm = F.rms_norm
    monkeypatch.setattr(F, "rms_norm", lambda *a, **k: fused_calls.append(1) or rms_norm(*a, **k))
    kernels.release()
    norms = _norms(drafter)
    assert norms and _norms(target)
    with kernels.fast_linears(target, draft=(drafter,)) as report:
        assert report.draft_norms == len(norms) and "RMSNorms fused" in str(report)
        assert all("forward" not in m.__dict__ for m in _norms(target))
        for m in norms:
            for rows in (1, 5):
                x = torch.randn(2, rows, m.weight.shape[0], dtype=dtype) * 3
                first, again = m(x), m(x)  # the first call checks; the second runs the fused one alone
                own = type(m).forward(m, x)
                assert torch.equal(first, own) and torch.equal(again, own) and again.dtype == dtype
    assert len(fused_calls) >= 2 * len(norms)  # power: the fused op really ran (check + every later call)
    assert kernels.fused_norms()[0] >= len(norms)
    assert all("forward" not in m.__dict__ for m in norms)  # restored


def test_a_fused_norm_unequal_to_its_own_keeps_the_modules_forward(monkeypatch):
    """Power check of the per-module check: a fused law that differs (Gemma's scale taken as Llama's weight-after)
    is caught on the first call, and the module runs its own forward from then on."""
    _, drafter = make_pair("gemma3")
    monkeypatch.setitem(kernels._NORM_STYLES, "Gemma3RMSNorm", "weight_after")
    with torch.no_grad():
        for m in _norms(drafter):
            m.weight.add_(0.5)
    kernels.release()
    with kernels.fast_linears(drafter.lm_head, draft=(drafter,)):
        m = _norms(drafter)[0]
        m.variance_epsilon = m.eps  # the Llama style's name for it, so the wrong law runs (and differs)
        x = torch.randn(1, 3, m.weight.shape[0])
        assert torch.equal(m(x), type(m).forward(m, x)) and torch.equal(m(x), type(m).forward(m, x))
        wrong = m.weight * F.rms_norm(x, (x.shape[-1],), None, m.eps)
        assert not torch.equal(wrong, type(m).forward(m, x))
        assert kernels._NORMS[m][3] is False
    assert kernels.fused_norms()[1] >= 1


def test_a_model_passed_as_a_target_keeps_its_norms_even_when_also_passed_as_draft():
    target, _ = make_pair("gemma3")
    with kernels.fast_linears(target, draft=(target,)) as report:
        assert report.draft_norms == 0 and all("forward" not in m.__dict__ for m in _norms(target))
    with kernels.fast_linears(target.lm_head, draft=(target,)) as report:  # power: as a drafter alone, swapped
        assert report.draft_norms == len(_norms(target)) > 0
