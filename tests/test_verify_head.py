"""Verify-time LM head (verify_head.py): same logits as the target's head, chosen by measurement, applied only
inside hf_vocabspec generate calls and restored after; lossless with a power check."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from marginals import check_detected, check_lossless, pruned_drafter
from tiny import VOCAB, make_pair
from transformers import GenerationMixin, StoppingCriteria, StoppingCriteriaList

import hf_vocabspec
from hf_vocabspec import kernels
from hf_vocabspec import verify_head as vh
from hf_vocabspec.generation import hooks

PROMPT = torch.tensor([[1, 6, 9, 14]])


@pytest.fixture(autouse=True)
def no_fast_linears(monkeypatch):
    """The verify head serves the head when the fast linears (kernels.py, tested in test_kernels) are off."""
    monkeypatch.setattr(kernels, "available", lambda: False)


@pytest.fixture
def forced(monkeypatch):
    """Force the weight-major kernel for every multi-row call (tiny heads would otherwise pick by timing)
    and record the row counts the head saw."""
    seen = []

    def spy(x, weight, bias=None):
        rows = x.numel() // x.shape[-1]
        seen.append(rows)
        return vh._weight_major(x, weight, bias) if rows > 1 else F.linear(x, weight, bias)

    monkeypatch.setattr(vh, "head_forward", spy)
    return seen


@pytest.fixture(scope="module")
def pair():
    target, base = make_pair("llama", seed=7, head_scale=8.0)
    drafter = hf_vocabspec.trim_drafter(base, range(VOCAB - 10))
    drafter.generation_config.num_assistant_tokens = 5
    return target, drafter


# --- kernels ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_every_kernel_matches_f_linear(dtype, bias):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(5000, 96, generator=g).to(dtype)
    b = torch.randn(5000, generator=g).to(dtype) if bias else None
    for rows in (2, 3, 6, 13):
        x = torch.randn(1, rows, 96, generator=g).to(dtype)
        ref = F.linear(x, weight, b)
        for name, kernel in vh.KERNELS.items():
            out = kernel(x, weight, b)
            assert out.shape == ref.shape and out.dtype == ref.dtype, name
            tol = 1e-5 if dtype == torch.float32 else 3e-2
            torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol * ref.abs().max().item())
            assert torch.equal(out.argmax(-1), ref.argmax(-1)), name


def test_choice_is_made_by_measurement(monkeypatch):
    """Fake kernels with known costs on a fake clock: the fastest wins only if it beats F.linear by the margin."""
    calls = {"linear": 0, "fast": 0, "slightly": 0}
    clock = [0.0]

    class FakeTime:
        @staticmethod
        def perf_counter():
            return clock[0]

    def timed(name, seconds):
        def kernel(x, w, b):
            calls[name] += 1
            clock[0] += seconds
            return F.linear(x, w, b)
        return kernel

    monkeypatch.setattr(vh, "time", FakeTime)
    monkeypatch.setattr(vh, "KERNELS", {"linear": timed("linear", 0.020), "fast": timed("fast", 0.005),
                                        "slightly": timed("slightly", 0.019)})
    monkeypatch.setattr(vh, "_CHOICES", {})
    weight = torch.randn(100, 8)
    with torch.no_grad():
        choice = vh.measure_head(weight, rows=4)
    assert choice.chosen == "fast" and choice.speedup == pytest.approx(4.0)
    assert all(len(t) == vh.TRIALS for t in choice.timings_ms.values())
    before = dict(calls)
    with torch.no_grad():
        vh.head_forward(torch.randn(1, 4, 8), weight)  # decided: no more trials, the winner runs
    assert calls["fast"] == before["fast"] + 1 and calls["linear"] == before["linear"]
    # a candidate within the margin does not replace the original head
    monkeypatch.setattr(vh, "KERNELS", {"linear": timed("linear", 0.020), "slightly": timed("slightly", 0.019)})
    with torch.no_grad():
        assert vh.measure_head(weight, rows=5).chosen == "linear"
    assert {c.key.rows for c in vh.kernel_choices()} == {4, 5}


def test_one_row_and_prefill_keep_f_linear(monkeypatch):
    monkeypatch.setattr(vh, "_CHOICES", {})
    weight = torch.randn(100, 8)
    with torch.no_grad():
        for rows in (1, vh.MAX_ROWS + 1):
            out = vh.head_forward(torch.randn(1, rows, 8), weight)
            assert out.shape == (1, rows, 100)
    assert vh.kernel_choices() == []  # no trial was started
    with pytest.raises(ValueError, match="2..64 rows"):
        vh.measure_head(weight, rows=1)


# --- model-level replacement --------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_model_logits_match_with_softcap_and_tied_weights(kind, forced):
    """Gemma 3 ties the head to the embeddings and soft-caps AFTER the head: the model's own logits match."""
    target, _ = make_pair(kind, seed=1, head_scale=8.0)
    head = target.get_output_embeddings()
    if kind == "gemma3":
        assert head.weight is target.get_input_embeddings().weight and target.config.final_logit_softcapping
    ids = torch.randint(3, VOCAB, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = target(ids, logits_to_keep=6).logits
        with vh.verify_head(target) as replaced:
            assert replaced and "forward" in head.__dict__
            out = target(ids, logits_to_keep=6).logits
    assert forced == [6]  # the head ran once, over the 6 kept rows
    assert "forward" not in head.__dict__  # restored
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(out.argmax(-1), ref.argmax(-1))
    if kind == "gemma3":
        assert out.abs().max() <= target.config.final_logit_softcapping  # the cap applied to our head's output


def test_context_restores_after_error_and_is_reentrant(forced):
    target, _ = make_pair("llama", seed=1)
    head = target.get_output_embeddings()
    with pytest.raises(RuntimeError, match="boom"), vh.verify_head(target):
        with vh.verify_head(target) as inner:
            assert inner is False  # already replaced: the inner block leaves it alone
        assert "forward" in head.__dict__
        raise RuntimeError("boom")
    assert "forward" not in head.__dict__
    with vh.verify_head(target, enabled=False) as replaced:
        assert replaced is False and "forward" not in head.__dict__


def test_quantised_or_hooked_heads_are_left_alone():
    target, _ = make_pair("llama", seed=1)
    head = target.get_output_embeddings()
    head.forward = lambda x: F.linear(x, head.weight)  # e.g. an accelerate offload hook
    try:
        with vh.verify_head(target) as replaced:
            assert replaced is False
        assert "forward" in head.__dict__
    finally:
        del head.forward

    class QLinear(torch.nn.Linear):
        pass

    target.lm_head = QLinear(32, VOCAB, bias=False)
    with vh.verify_head(target) as replaced:
        assert replaced is False


# --- inside generate ----------------------------------------------------------------------------------
def test_wrapper_keeps_signature_and_is_installed():
    params = inspect.signature(GenerationMixin._assisted_decoding).parameters
    assert "inputs_tensor" in params and "assistant_model" in params  # generate() inspects this signature
    assert "_assisted_decoding" in hooks._ORIGINALS


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_greedy_identical_with_verify_head_on(kind, forced):
    target, base = make_pair(kind, seed=3, head_scale=8.0)
    drafter = hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)) + [3, 5])
    assert drafter.use_verify_head
    head = target.get_output_embeddings()
    g = torch.Generator().manual_seed(0)
    accepted = 0
    for _ in range(8):
        prompt = torch.randint(3, VOCAB, (1, int(torch.randint(1, 12, (1,), generator=g))), generator=g)
        ref = target.generate(prompt, do_sample=False, max_new_tokens=30)
        forced.clear()
        out = target.generate(prompt, do_sample=False, max_new_tokens=30, assistant_model=drafter)
        assert torch.equal(ref, out), (prompt, ref, out)
        assert "forward" not in head.__dict__  # restored after the call
        assert max(forced) > 1  # verify forwards went through the verify head
        accepted += drafter.last_speculation_stats.accepted
    assert accepted > 0


def test_one_kernel_choice_fast_linears_first_then_the_verify_head(pair, monkeypatch):
    """generation.hooks enters only generate_kernels: where the fast linears are on they hold the head and the
    verify head stands aside; where they are off (here: no oneDNN, or switched off) the verify head serves it."""
    target, drafter = pair
    source = inspect.getsource(hooks)
    assert "generate_kernels(" in source and "fast_linears(" not in source and ".verify_head(" not in source
    head = target.get_output_embeddings()
    with vh.generate_kernels(target, drafter) as fast:  # no oneDNN (the autouse fixture): the verify head
        assert fast.layers == 0 and head.forward.__func__ is vh._verify_forward
    assert "forward" not in head.__dict__
    if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        monkeypatch.setattr(kernels, "available", lambda: True)
        with vh.generate_kernels(target, drafter) as fast:
            assert fast.layers > 0 and head.forward.__func__ is kernels._forward
        drafter.use_fast_linears = False
        try:
            with vh.generate_kernels(target, drafter) as fast:
                assert fast.layers == 0 and head.forward.__func__ is vh._verify_forward
        finally:
            del drafter.use_fast_linears
    assert "forward" not in head.__dict__


def test_switch_off_and_plain_assistants_use_the_original_head(pair, forced):
    target, drafter = pair
    drafter.use_verify_head = False
    try:
        target.generate(PROMPT, do_sample=False, max_new_tokens=12, assistant_model=drafter)
    finally:
        drafter.use_verify_head = True
    assert forced == []
    # HF's own assisted generation with an ordinary model: untouched
    plain, _ = make_pair("llama", seed=7, head_scale=8.0)
    target.generate(PROMPT, do_sample=False, max_new_tokens=12, assistant_model=plain)
    assert forced == []
    target.generate(PROMPT, do_sample=False, max_new_tokens=12, assistant_model=drafter)
    assert forced and max(forced) > 1


def test_switch_is_saved_with_the_drafter(pair, tmp_path):
    _, drafter = pair
    drafter.config.verify_head = False
    try:
        drafter.save_pretrained(tmp_path)
        loaded = hf_vocabspec.TrimmedDrafter.from_pretrained(tmp_path)
    finally:
        drafter.config.verify_head = True
    assert loaded.config.verify_head is False and loaded.use_verify_head is False
    assert hf_vocabspec.TrimmedDrafterConfig().verify_head is True


def test_restored_after_an_exception_inside_generate(pair, forced):
    target, drafter = pair

    class Explode(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        target.generate(PROMPT, do_sample=False, max_new_tokens=12, assistant_model=drafter,
                        stopping_criteria=StoppingCriteriaList([Explode()]))
    assert forced and "forward" not in target.get_output_embeddings().__dict__


def test_uninstall_gives_back_the_original_and_install_is_idempotent():
    wrapped = GenerationMixin._assisted_decoding
    hooks.install()
    assert GenerationMixin._assisted_decoding is wrapped
    hooks.uninstall()
    try:
        assert GenerationMixin._assisted_decoding is wrapped.__wrapped__
    finally:
        hooks.install()
    assert GenerationMixin._assisted_decoding is not wrapped.__wrapped__


# --- lossless sampling with the verify head, and its power check ---------------------------------------
@pytest.fixture(scope="module")
def lossless_pair():
    return pruned_drafter("llama")


def test_sampling_with_verify_head_is_lossless(lossless_pair, forced):
    """Chi-square of the first two sampled tokens against the exact target marginals (test_lossless)."""
    target, drafter, probe = lossless_pair
    check_lossless(target, drafter, {"temperature": 0.9}, pruned_probe=probe)
    assert 3 in forced  # num_assistant_tokens=2: verify forwards of 3 rows went through the verify head


def test_wrong_verify_head_is_detected(lossless_pair, monkeypatch):
    """Power check: a verify head whose multi-row logits are wrong (rows rolled by one token id) must fail."""
    target, drafter, probe = lossless_pair

    def wrong(x, weight, bias=None):
        out = F.linear(x, weight, bias)
        return out.roll(1, dims=-1) if x.numel() // x.shape[-1] > 1 else out

    monkeypatch.setattr(vh, "head_forward", wrong)
    check_detected(target, drafter, {"temperature": 0.9}, pruned_probe=probe)


# --- latency measurement ------------------------------------------------------------------------------------
def test_measure_verify_latency_times_decode_and_verify_widths():
    target, _ = make_pair("gemma3", seed=1)  # sliding-window layers: the cache must crop back after each forward
    lat = vh.measure_verify_latency(target, rows=(3, 6), context_length=12, repeats=3)
    assert set(lat.ms) == {1, 3, 6} and all(len(t) == 3 for t in lat.ms.values())
    assert lat.verify_head and set(lat.kernels) == {1, 3, 6} and lat.kernels[1] == "linear"
    assert lat.ratio(6) == pytest.approx(sorted(v / d for v, d in zip(lat.ms[6], lat.ms[1]))[1])
    assert lat.spread(6)[0] <= lat.ratio(6) <= lat.spread(6)[1]
    assert "forward" not in target.get_output_embeddings().__dict__
    off = vh.measure_verify_latency(target, rows=(3,), context_length=12, repeats=2, use_verify_head=False)
    assert not off.verify_head and off.kernels == {1: "linear", 3: "linear"}
    with pytest.raises(ValueError, match="rows are verify widths"):
        vh.measure_verify_latency(target, rows=(1,))


# --- real model (integration) -----------------------------------------------------------------------------
@pytest.mark.integration
def test_real_gemma_logits_and_argmax_match_its_own_head():
    """Gemma 3 270M (fp32, tied 262,144 x 640 head; soft-capping when its config sets it): every kernel, on real chat
    prompts, gives the model's own logits within float tolerance and the same argmax; then greedy assisted
    generation with the verify head equals target-only greedy."""
    from hf_vocabspec.evaluation.data import eval_prompts
    from hf_vocabspec.evaluation.offline import (
        load_chat_dataset,
        load_model,
        load_tokenizer,
    )

    name = "offline:gemma-3-270m"
    tokenizer = load_tokenizer(name)
    target = load_model(name, dtype=torch.float32).eval()
    prompts = eval_prompts(load_chat_dataset("offline:sharegpt"), tokenizer, start=0, n=3, max_prompt_tokens=96)
    head = target.get_output_embeddings()
    assert head.weight is target.get_input_embeddings().weight  # tied
    cap = target.config.final_logit_softcapping  # None for this checkpoint; the tiny Gemma 3 tests cover a cap
    for ids in prompts:
        with torch.no_grad():
            ref = target(ids, logits_to_keep=6).logits
            for kernel in vh.KERNELS.values():
                hidden: dict = {}
                handle = head.register_forward_hook(lambda m, args, out, hidden=hidden: hidden.setdefault("x", args[0]))
                try:
                    target(ids, logits_to_keep=6)
                finally:
                    handle.remove()
                raw = kernel(hidden["x"], head.weight, None)
                out = raw if cap is None else torch.tanh(raw / cap) * cap
                torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
                assert torch.equal(out.argmax(-1), ref.argmax(-1))
            with vh.verify_head(target):  # the model's own path, whatever kernel the trials pick
                mine = target(ids, logits_to_keep=6).logits
            torch.testing.assert_close(mine, ref, rtol=1e-4, atol=1e-4)
            assert torch.equal(mine.argmax(-1), ref.argmax(-1))
    drafter = hf_vocabspec.trim_drafter(load_model(name, dtype=torch.bfloat16), range(60000), tokenizer=tokenizer)
    ids = prompts[0]
    mask = torch.ones_like(ids)
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24)
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24, assistant_model=drafter)
    assert torch.equal(ref, out)
    assert any(c.key.out_features == head.weight.shape[0] for c in vh.kernel_choices())  # trials ran on the real head


def test_which_assistants_get_the_verify_head(pair):
    """TrimmedDrafter (its switch), hf_vocabspec session objects such as SSD's (their own switch, else their
    drafter's), never an ordinary HF assistant."""
    _, drafter = pair

    class Session:  # the shape of hf_vocabspec.ssd.SSDSession as the wrapper sees it
        def __init__(self, drafter):
            self.drafter = drafter

        def _hf_vocabspec_candidate_generator(self, **kwargs):
            raise AssertionError("not called here")

    plain, _ = make_pair("llama", seed=7)
    assert vh.wants_verify_head(drafter) and not vh.wants_verify_head(plain) and not vh.wants_verify_head(None)
    session = Session(drafter)
    assert vh.wants_verify_head(session)
    drafter.use_verify_head = False
    try:
        assert not vh.wants_verify_head(drafter) and not vh.wants_verify_head(session)
        session.use_verify_head = True  # a session's own switch wins
        assert vh.wants_verify_head(session)
    finally:
        drafter.use_verify_head = True
