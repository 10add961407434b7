"""Batched speculative decoding (generation/engine.py): batch > 1 and num_return_sequences > 1 are lossless per row.

Greedy: every row token-identical to batch-1 target-only decoding of that row's own (unpadded) prompt, on tiny
float64 models (no float ties), for unequal prompt lengths, rows that stop early at EOS, and a sliding-window model
(window 4) with prompts well past the window. Sampling: per-row first/second-token marginals against the exact
target marginals of each row's prompt (tests/marginals.py threshold), with power checks: a wrong q and a row
mix-up must fail.
"""

from __future__ import annotations

import statistics

import pytest
import torch
from marginals import PVALUE_THRESHOLD, chi2_pvalue, exact_marginals
from tiny import EOS, VOCAB, fake_compile, make_pair
from tiny import left_padded as _batch

import hf_vocabspec
from hf_vocabspec.generation import draft_step, engine

KEEP = sorted({i for i in range(VOCAB) if i % 3 != 1} | {1, EOS})


def _pair(kind: str, dtype=torch.float64, length: int = 4, speculation: str = "on", timed_kernels: bool = True):
    """``timed_kernels=False``: no fast linears and no verify head. An iteration that trials kernels is not measured
    by the auto rule, and a short call of a tiny float64 pair would spend most of its iterations on the verify head's
    trials (or none, where earlier tests in the process made those choices): tests of the rule's own decisions
    turn them off."""
    target, base = make_pair(kind, head_scale=4.0, noise=0.05)
    target, base = target.to(dtype), base.to(dtype)
    drafter = hf_vocabspec.trim_drafter(base, KEEP).to(dtype)
    drafter.generation_config.num_assistant_tokens = length
    drafter.generation_config.batched_speculation = speculation
    drafter.use_fast_linears = drafter.use_verify_head = timed_kernels
    return target, drafter


def _reference(target, ids, mask, **kw) -> list[list[int]]:
    """Batch-1 target-only greedy of each row's own unpadded prompt."""
    out = []
    for row, m in zip(ids, mask):
        prompt = row[m.bool()][None]
        seq = target.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, **kw)
        out.append(seq[0, prompt.shape[1] :].tolist())
    return out


def _rows(out, P, eos=None) -> list[list[int]]:
    rows = []
    for row in out[:, P:].tolist():
        if eos is not None and eos in row:
            row = row[: row.index(eos) + 1]
        rows.append(row)
    return rows


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
@pytest.mark.parametrize("lengths", [[5, 2], [3, 9, 14, 6, 1], [7, 12, 4, 16, 2, 9, 11, 5]])
def test_greedy_rows_identical_to_batch_one(kind, lengths):
    target, drafter = _pair(kind)
    ids, mask = _batch(lengths)
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=24,
                          do_sample=False)
    assert _rows(out, ids.shape[1], EOS) == _reference(target, ids, mask, max_new_tokens=24)
    stats = drafter.last_speculation_stats
    assert stats.batch_size == len(lengths) and stats.rounds > 0 and stats.decision.startswith("speculate")
    assert stats.proposed == sum(stats.per_round_proposed) and stats.accepted == sum(stats.per_round_accepted)


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_one_token_steps_take_their_position_ids_from_windows(kind, monkeypatch):
    """A one-token step's position ids are a view from a window of the layout's grid (``_step_positions``): with
    windows of 3 columns (crossed every round, rebuilt at every layout change), every forward's position ids are
    still each row's column minus its padding; the drafts (acceptance) are those of full-width windows, and the
    output target-only's. (Wrong drafter positions would only lower acceptance: the positions are checked
    directly.)"""
    target, drafter = _pair(kind)
    ids, mask = _batch([7, 12, 4])
    layout, checked = engine.SpeculativeEngine._layout, []

    def checking(self, cache, n):
        out = layout(self, cache, n)
        start = cache.length
        expected = (torch.arange(start, start + n)[None, :] - self.pad_cols[:, None]).clamp(min=0)
        assert torch.equal(out[1], expected), (start, n)
        checked.append(n)
        return out

    monkeypatch.setattr(engine.SpeculativeEngine, "_layout", checking)
    kw = dict(input_ids=ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=24, do_sample=False)
    wide = target.generate(**kw)
    wide_accepted = drafter.last_speculation_stats.per_round_accepted
    monkeypatch.setattr(engine, "STEP_COLUMNS", 3)
    narrow = target.generate(**kw)
    assert torch.equal(narrow, wide)
    assert drafter.last_speculation_stats.per_round_accepted == wide_accepted
    assert _rows(narrow, ids.shape[1], EOS) == _reference(target, ids, mask, max_new_tokens=24)
    assert checked.count(1) > 20 and any(n > 1 for n in checked)


def test_rows_that_end_early_at_eos_get_pad_and_the_rest_go_on():
    target, drafter = _pair("gemma3")
    ids, mask = _batch([6, 10, 3, 8])
    free = _reference(target, ids, mask, max_new_tokens=20)
    eos = free[0][4]  # row 0 produces this token early: make it the end token
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=20,
                          do_sample=False, eos_token_id=eos, pad_token_id=0)
    ref = _reference(target, ids, mask, max_new_tokens=20, eos_token_id=eos, pad_token_id=0)
    P = ids.shape[1]
    assert _rows(out, P, eos) == ref
    for row, r in zip(out[:, P:].tolist(), ref):  # after its EOS a row holds only pad
        assert row[len(r) :] == [0] * (len(row) - len(r))
    assert len(ref[0]) <= 5 < max(len(r) for r in ref) and out.shape[1] - P == max(len(r) for r in ref)


def test_sliding_window_prompts_far_past_the_window():
    """Window 4 on two of three layers; prompts of 30-40 tokens, realignment shifts rows every round."""
    target, drafter = _pair("gemma3", length=5)
    ids, mask = _batch([40, 31, 35, 30], seed=3)
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=30,
                          do_sample=False)
    assert _rows(out, ids.shape[1], EOS) == _reference(target, ids, mask, max_new_tokens=30)
    stats = drafter.last_speculation_stats
    assert drafter.use_context_tokens and 0 < stats.context_proposed <= stats.proposed


def test_forced_off_is_plain_decoding_and_auto_decides_from_measurements():
    target, drafter = _pair("llama", speculation="off", timed_kernels=False)
    ids, mask = _batch([5, 9, 3])
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=12,
                          do_sample=False)
    ref = _reference(target, ids, mask, max_new_tokens=12)
    assert _rows(out, ids.shape[1], EOS) == ref
    stats = drafter.last_speculation_stats
    assert stats.rounds == 0 and stats.plain_steps == 12 and stats.decision.startswith("decode (forced")
    drafter.generation_config.batched_speculation = "auto"
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=30,
                          do_sample=False)
    assert _rows(out, ids.shape[1], EOS) == _reference(target, ids, mask, max_new_tokens=30)
    stats = drafter.last_speculation_stats
    assert stats.decision.startswith(("speculate (measured", "decode (measured")), stats.decision
    assert stats.plain_steps >= engine.PROBE_MEASUREMENTS and stats.rounds >= engine.PROBE_MEASUREMENTS  # probes
    assert stats.decisions and "tok/s" in stats.decisions[0]


def _measured(mode: str, rate: float, rows: int, *iterations: int) -> list:
    """Iterations of ``mode`` at ``rate`` tokens/s (``rows`` tokens each)."""
    return [engine.Measured(mode, rows, rows / rate, rows, i) for i in iterations]


def test_auto_judges_realized_throughput_and_switches_either_way():
    """choose_mode: probe what lacks fresh measurements, then the faster mode; a shrinking batch or age makes
    measurements stale, so the other mode is probed again and the choice can flip back."""
    P = engine.PROBE_MEASUREMENTS
    assert engine.choose_mode([], 8, 0)[0] == "speculate"
    spec = _measured("speculate", 105.0, 8, *range(1, P + 1))
    assert engine.choose_mode(spec[:-1], 8, P) == ("speculate", "probe speculate")
    assert engine.choose_mode(spec, 8, P + 1) == ("decode", "probe decode")
    plain = _measured("decode", 145.0, 8, *range(P + 1, 2 * P + 1))
    mode, why = engine.choose_mode(spec + plain, 8, 2 * P + 1)
    assert mode == "decode" and "105.0 tok/s speculating vs 145.0 plain at 8 rows" in why
    # rows finished: 5 of 8 left, both modes' measurements are stale -> speculation is probed again
    i = 2 * P + 2
    assert engine.choose_mode(spec + plain, 5, i)[0] == "speculate"
    fresh_spec = _measured("speculate", 92.0, 5, *range(i, i + P))
    assert engine.choose_mode(spec + plain + fresh_spec, 5, i + P)[0] == "decode"  # plain still needs a fresh probe
    fresh_plain = _measured("decode", 61.0, 5, *range(i + P, i + 2 * P))
    assert engine.choose_mode(spec + plain + fresh_spec + fresh_plain, 5, i + 2 * P)[0] == "speculate"
    # age alone makes a measurement stale
    late = i + 2 * P + engine.FRESH_ITERATIONS
    assert engine.choose_mode(fresh_spec + fresh_plain, 5, late)[0] == "speculate"
    assert engine.choose_mode(fresh_spec + fresh_plain, 5, late)[1].startswith("probe")


def test_auto_rate_is_realized_throughput_without_one_offs():
    """A mode's realized rate: its iterations' total tokens over their total seconds, leaving out an iteration at
    under half the median rate. Power checks, each a way a simpler estimator decides wrongly at batch 2:
    - skewed acceptance at a fixed draft length: rounds of 2, 12, 2 tokens in 0.1 s each make 53 tok/s, not the
      median round's 20 (the median of 2 per-iteration rates, the first rule, decoded);
    - the confidence stop: a round's seconds grow with its tokens, (6, 0.29), (12, 0.51), (5, 0.235) make 22.2 tok/s,
      not mean tokens over median seconds' 26.4 (the second rule: it speculated against plain's 24);
    - a plain step that paid a one-off (1 s instead of 0.04 s) does not make plain decoding look slow (a mean of
      rates would)."""
    M = engine.Measured
    rounds = [M("speculate", t, 0.1, 2, i) for i, t in enumerate((2, 12, 2))]
    steps = [M("decode", 2, 0.08, 2, 3 + i) for i in range(3)]  # 25 tok/s
    assert engine.realized_rate(rounds) == pytest.approx(16 / 0.3)
    mode, why = engine.choose_mode(rounds + steps, 2, 6)
    assert mode == "speculate" and "53.3 tok/s speculating vs 25.0 plain" in why
    assert statistics.median(x.tokens / x.seconds for x in rounds) < 25.0  # (what the first rule measured)
    stopped = [M("speculate", t, s, 2, i) for i, (t, s) in enumerate(((6, 0.29), (12, 0.51), (5, 0.235)))]
    plain_24 = [M("decode", 2, 2 / 24, 2, 3 + i) for i in range(3)]
    assert engine.realized_rate(stopped) == pytest.approx(23 / 1.035)
    assert engine.choose_mode(stopped + plain_24, 2, 6)[0] == "decode"
    assert statistics.fmean(x.tokens for x in stopped) / statistics.median(x.seconds for x in stopped) > 24.0
    even = [M("speculate", 4, 0.1, 2, i) for i in range(3)]  # 40 tok/s
    fast = [M("decode", 2, s, 2, 3 + i) for i, s in enumerate((0.04, 0.04, 1.0))]  # 50 tok/s and a one-off
    assert engine.realized_rate(fast) == pytest.approx(50.0)
    assert engine.choose_mode(even + fast, 2, 6)[0] == "decode"
    assert statistics.fmean(x.tokens / x.seconds for x in fast) < 40.0  # a mean of rates would have missed it
    assert sum(x.tokens for x in fast) / sum(x.seconds for x in fast) < 40.0  # and so would plain totals
    assert engine.PROBE_MEASUREMENTS >= 3  # a median outvotes one one-off only with 3 or more


def test_num_return_sequences_greedy_needs_sampling_like_transformers():
    target, drafter = _pair("llama")
    ids, mask = _batch([5])
    with pytest.raises(ValueError, match="num_return_sequences"):
        target.generate(input_ids=ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=4,
                        do_sample=False, num_return_sequences=3)


# --- sampling: exact per-row marginals, batch > 1 and num_return_sequences > 1, with power checks ----------
PROMPTS = [torch.tensor([1, 5, 7, 12, 9]), torch.tensor([1, 22, 40])]
KNOBS = {"temperature": 0.9, "repetition_penalty": 3.0}  # the penalty makes p depend on each row's own context
COPIES, CALLS = 50, 20  # 2 prompts x 50 sequences per call x 20 calls = 1000 draws per prompt


def _sampled_pair():
    target, base = make_pair("llama", head_scale=12.0)
    with torch.no_grad():
        p1 = target(PROMPTS[0][None]).logits[0, -1].softmax(-1)
    order = [t for t in p1.argsort(descending=True).tolist() if t != EOS]
    keep = sorted(set(range(VOCAB)) - set(order[1:12]))  # prune the 2nd..12th likeliest: the residual matters
    drafter = hf_vocabspec.trim_drafter(base, keep)
    drafter.generation_config.num_assistant_tokens = 2
    drafter.generation_config.batched_speculation = "on"
    return target, drafter


def _draw(target, drafter, seed=7) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    P = max(len(p) for p in PROMPTS)
    ids = torch.zeros(len(PROMPTS), P, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(PROMPTS):
        ids[i, P - len(p) :], mask[i, P - len(p) :] = p, 1
    samples = [[] for _ in PROMPTS]
    for _ in range(CALLS):
        out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=drafter, do_sample=True, top_k=0,
                              max_new_tokens=3, min_new_tokens=3, num_return_sequences=COPIES, **KNOBS)
        for i in range(len(PROMPTS)):  # HF's order: each prompt's copies are consecutive
            samples[i].append(out[i * COPIES : (i + 1) * COPIES, P : P + 2])
    return [torch.cat(s) for s in samples]


def _pvalues(target, samples) -> list[float]:
    out = []
    for prompt, s in zip(PROMPTS, samples):
        p1, p2 = exact_marginals(target, prompt[None], KNOBS)
        out += [chi2_pvalue(s[:, 0], p1), chi2_pvalue(s[:, 1], p2)]
    return out


@pytest.fixture(scope="module")
def sampled_pair():
    return _sampled_pair()


def test_sampling_marginals_exact_per_row(sampled_pair):
    target, drafter = sampled_pair
    pvalues = _pvalues(target, _draw(target, drafter))
    assert min(pvalues) >= PVALUE_THRESHOLD, pvalues
    assert drafter.last_speculation_stats.batch_size == len(PROMPTS) * COPIES


def test_sampling_marginals_exact_with_a_compiled_verify(sampled_pair, monkeypatch):
    """Under a compiled verify the rounds at a call's end draft all L (one verify width): drafts past a row's
    budget are verified but never emitted. 3-token calls with L = 2: every call's later rounds are such rounds."""
    target, drafter = sampled_pair
    widths = fake_compile(monkeypatch, target)
    pvalues = _pvalues(target, _draw(target, drafter))
    assert min(pvalues) >= PVALUE_THRESHOLD, pvalues
    assert drafter.last_speculation_stats.compiled_verify and set(widths) <= {1, 3}, set(widths)


def test_power_wrong_q_fails(sampled_pair, monkeypatch):
    target, drafter = sampled_pair
    original = engine.SpeculativeEngine._verify

    def wrong_q(self, q, drafts, p_logits, proposes):  # verify against a q the drafts were NOT drawn from
        bent = q**3
        return original(self, bent / bent.sum(-1, keepdim=True), drafts, p_logits, proposes)

    monkeypatch.setattr(engine.SpeculativeEngine, "_verify", wrong_q)
    assert min(_pvalues(target, _draw(target, drafter))) < PVALUE_THRESHOLD


def test_power_row_mix_up_fails(sampled_pair, monkeypatch):
    """Each row's processors must see its OWN context: hand every row its neighbour's and the test must fail."""
    target, drafter = sampled_pair
    original = engine.SpeculativeEngine._candidates

    def mixed(self, drafts):
        ids = original(self, drafts)
        return ids.roll(ids.shape[0] // 2, dims=0)

    monkeypatch.setattr(engine.SpeculativeEngine, "_candidates", mixed)
    assert min(_pvalues(target, _draw(target, drafter))) < PVALUE_THRESHOLD


# --- bad input: one line that names the fix, before any forward pass --------------------------------------
def test_right_padded_batch_is_refused():
    target, drafter = _pair("llama")
    ids, mask = _batch([5, 3])
    right = torch.stack([torch.roll(r, -int((m == 0).sum())) for r, m in zip(ids, mask)])
    rmask = torch.stack([torch.roll(m, -int((m == 0).sum())) for m in mask])
    with pytest.raises(ValueError, match="padding_side='left'"):
        target.generate(input_ids=right, attention_mask=rmask, assistant_model=drafter, max_new_tokens=3)
    with pytest.raises(ValueError, match="padding_side='left'"):  # batch 1 too
        target.generate(input_ids=right[1:], attention_mask=rmask[1:], assistant_model=drafter, max_new_tokens=3)


def test_bad_ids_and_empty_prompt_are_refused():
    target, drafter = _pair("llama")
    ids, mask = _batch([4, 4])
    bad = ids.clone()
    bad[1, -1] = VOCAB + 5
    with pytest.raises(ValueError, match="outside the target's vocabulary"):
        target.generate(input_ids=bad, attention_mask=mask, assistant_model=drafter, max_new_tokens=3)
    empty = torch.zeros(1, 0, dtype=torch.long)
    with pytest.raises(ValueError, match="prompt is empty"):
        target.generate(input_ids=empty, attention_mask=empty, assistant_model=drafter, max_new_tokens=3)


def test_prompt_longer_than_the_models_positions_is_refused():
    target, drafter = _pair("llama")
    ids = torch.randint(3, VOCAB, (2, 300))
    with pytest.raises(ValueError, match="at most 256 positions"):
        target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), assistant_model=drafter, max_new_tokens=3)


def test_drafter_for_another_vocabulary_is_refused_at_batch_two():
    target, _ = _pair("llama")
    from tiny import llama_config
    from transformers import LlamaForCausalLM

    other = hf_vocabspec.trim_drafter(LlamaForCausalLM(llama_config(vocab_size=VOCAB * 2)).eval(), list(range(40)))
    ids, mask = _batch([4, 6])
    with pytest.raises(hf_vocabspec.VocabularyMapError, match="share a tokenizer"):
        target.generate(input_ids=ids, attention_mask=mask, assistant_model=other, max_new_tokens=3)


def test_invalid_batched_speculation_is_refused():
    target, drafter = _pair("llama")
    ids, mask = _batch([4, 6])
    drafter.generation_config.batched_speculation = "sometimes"
    with pytest.raises(ValueError, match="batched_speculation"):
        target.generate(input_ids=ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=3)


def test_untrimmed_same_vocabulary_assistant_batches_through_our_loop():
    """transformers refuses assisted generation at batch > 1; a plain drafter with the target's vocabulary
    drafts through hf_vocabspec's loop instead (full head), rows identical to batch-1 target-only."""
    target, base = make_pair("gemma3", head_scale=4.0, noise=0.05)
    target, base = target.double(), base.double()
    base.generation_config.num_assistant_tokens = 3
    ids, mask = _batch([6, 11, 4])
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=base, max_new_tokens=16,
                          do_sample=False)
    assert _rows(out, ids.shape[1], EOS) == _reference(target, ids, mask, max_new_tokens=16)
    assert base.last_speculation_stats.batch_size == 3


def test_auto_re_measures_a_close_verdict():
    """A close verdict (within CLOSE_VERDICT) re-probes the slower mode once its measurements are
    RECHECK_ITERATIONS old, and then judges it by the new ones alone: measurements of a first call that paid
    one-offs stop deciding. A clear verdict is not re-probed before FRESH_ITERATIONS (power: the same ages)."""
    P, R = engine.PROBE_MEASUREMENTS, engine.RECHECK_ITERATIONS
    slow_spec = _measured("speculate", 24.0, 2, *range(P))  # paid one-offs: 24 tok/s against plain's 26
    plain = _measured("decode", 26.0, 2, *range(P, 2 * P))
    assert engine.choose_mode(slow_spec + plain, 2, 2 * P)[0] == "decode"
    later = R + P  # the speculative measurements are now older than R iterations
    plain_now = plain + _measured("decode", 26.0, 2, *range(2 * P, later))
    mode, why = engine.choose_mode(slow_spec + plain_now, 2, later)
    assert (mode, why) == ("speculate", "probe speculate (a close verdict, re-measured)")
    spec_now = _measured("speculate", 31.0, 2, *range(later, later + P))  # its true speed
    mode, why = engine.choose_mode(slow_spec + plain_now + spec_now, 2, later + P)
    assert mode == "speculate" and "31.0 tok/s speculating vs 26.0 plain" in why  # the old ones no longer count
    clear_spec = _measured("speculate", 15.0, 2, *range(P))  # a clear verdict: no re-probe at the same age
    assert engine.choose_mode(clear_spec + plain_now, 2, later) == (
        "decode", "decode (measured: 15.0 tok/s speculating vs 26.0 plain at 2 rows)")


def test_auto_remembers_its_measurements_for_the_next_calls():
    """A call starts in the mode earlier calls measured faster at its rows (no probes), recalled measurements
    count as fresh only at about the same rows, and expire after MEMORY_CALLS calls."""
    M = engine.Measured
    memory = engine._Memory()
    setting = ("t", False, 5)
    P = engine.PROBE_MEASUREMENTS
    spec = _measured("speculate", 105.0, 8, *range(1, P + 1))
    plain = _measured("decode", 145.0, 8, *range(P + 1, 2 * P + 1))
    memory.keep(setting, spec + plain)
    recalled = memory.recall(setting)
    assert all(x.iteration == 0 and x.calls_ago == 1 for x in recalled)
    mode, why = engine.choose_mode(recalled, 8, 0)
    assert mode == "decode" and f"{2 * P} of them from earlier calls" in why
    assert engine.choose_mode(recalled, 4, 0)[1] == "probe speculate"  # other rows: not fresh (either way)
    assert engine.choose_mode(recalled, 8, engine.FRESH_ITERATIONS)[1] == "probe speculate"  # aged in this call
    assert memory.recall(("t", True, 5)) == []  # another setting remembers nothing
    for _ in range(engine.MEMORY_CALLS):  # calls that measure nothing new: the verdict expires
        recalled = memory.recall(setting)
        memory.keep(setting, recalled)
    assert memory.recall(setting) == []

    # in generate: the second call with the same drafter decides at once, output still target-only's
    target, drafter = _pair("llama", speculation="auto", timed_kernels=False)
    ids, mask = _batch([5, 9, 3])
    ref = _reference(target, ids, mask, max_new_tokens=30)
    for call in range(2):
        out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=30,
                              do_sample=False)
        assert _rows(out, ids.shape[1], EOS) == ref
    decisions = drafter.last_speculation_stats.decisions
    assert decisions and decisions[0].startswith("after 0 rounds, 0 plain steps:") and "earlier calls" in decisions[0]


@pytest.mark.parametrize("counter_name", ["compiled_graphs", "trials_run"])
def test_auto_does_not_measure_an_iteration_that_compiled_or_ran_kernel_trials(monkeypatch, counter_name):
    """An iteration that compiles a graph (compiled draft steps: the first of each step shape) takes seconds, and one
    in which the fast linears or the verify head trialled kernels ran their slower candidates (a process's first
    calls, where a speculative round's new verify widths are trialled): the auto rule keeps no measurement of either
    (else it would judge speculation by them and remember that). Power: with the counter still, the same call
    measures."""
    target, drafter = _pair("llama", speculation="auto")
    ids, mask = _batch([5, 9, 3])
    ref = _reference(target, ids, mask, max_new_tokens=12)
    compiled = counter_name == "compiled_graphs"
    if compiled:
        monkeypatch.setattr(drafter, "compile_draft_step", True, raising=False)
        monkeypatch.setattr(draft_step, "compiled_call", lambda module, options: module)  # "compiled": eager body
    kept = []
    keep = engine._Memory.keep
    monkeypatch.setattr(engine._Memory, "keep", lambda self, setting, measured: (kept.append(list(measured)),
                                                                                   keep(self, setting, measured)))
    tick = iter(range(10**6))
    for counter, measures in ((lambda: next(tick), False), (lambda: 7, True)):
        engine._MEMORIES.pop(drafter, None)
        monkeypatch.setattr(engine, counter_name, counter)
        out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=12,
                              do_sample=False)
        assert _rows(out, ids.shape[1], EOS) == ref and drafter.last_speculation_stats.compiled_draft == compiled
        assert bool(kept[-1]) == measures, kept[-1]


def test_rounds_of_several_rows_draft_at_most_5_of_a_confidence_stopped_L(library_draft_defaults):
    """A fresh drafter's L=12 is a cap for its confidence stop; several rows cannot stop together often, so their
    rounds (of CAPPED_FROM_ROWS rows or more: the first round of three rows here) draft CAPPED_DRAFT_LENGTH at most,
    unless generate() is given num_assistant_tokens or no stop."""
    from hf_vocabspec.configuration import CAPPED_DRAFT_LENGTH

    target, base = make_pair("llama", seed=3)
    drafter = hf_vocabspec.trim_drafter(base, range(VOCAB))
    drafter.generation_config.batched_speculation = "on"
    ids = torch.randint(3, VOCAB, (3, 6), generator=torch.Generator().manual_seed(0))
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=30)
    ref = target.generate(ids, **kw)

    def longest(**extra):
        out = target.generate(ids, assistant_model=drafter, **kw, **extra)
        assert torch.equal(out, ref)
        return max(drafter.last_speculation_stats.per_round_proposed[:3])  # the first round's (all three rows)

    gc = drafter.generation_config
    assert (CAPPED_DRAFT_LENGTH, gc.num_assistant_tokens, gc.assistant_confidence_threshold) == (5, 12, 0.4)
    assert longest() == CAPPED_DRAFT_LENGTH
    assert longest(num_assistant_tokens=12) > CAPPED_DRAFT_LENGTH
    assert longest(assistant_confidence_threshold=0.0) > CAPPED_DRAFT_LENGTH  # no stop: L is a length, not a cap


def test_rounds_of_fewer_rows_than_capped_from_rows_draft_the_uncapped_L(library_draft_defaults):
    """Once a batch's rows left are fewer than CAPPED_FROM_ROWS, their rounds draft up to the drafter's L again
    (their confidence stop ends the rounds, as at batch 1): a round of two rows proposes more than
    CAPPED_DRAFT_LENGTH, the output stays target-only's; while all three rows run, at most CAPPED_DRAFT_LENGTH.
    (The former rule, capped for every round of several rows, fails the second half.)"""
    from hf_vocabspec.configuration import CAPPED_DRAFT_LENGTH, CAPPED_FROM_ROWS

    assert CAPPED_FROM_ROWS == 3
    target, base = make_pair("llama", seed=3, noise=0.0)  # every draft the target's own: long confident runs
    drafter = hf_vocabspec.trim_drafter(base, range(VOCAB))
    drafter.generation_config.batched_speculation = "on"
    ids, mask = _batch([6, 9, 7])
    free = _reference(target, ids, mask, max_new_tokens=40)
    eos = next(t for t in free[0][1:4] if t not in free[1] + free[2])  # row 0 ends within 4 tokens, the rest go on
    kw = dict(attention_mask=mask, do_sample=False, max_new_tokens=40, eos_token_id=eos, pad_token_id=0)
    out = target.generate(ids, assistant_model=drafter, **kw)
    assert _rows(out, ids.shape[1], eos) == _reference(target, ids, mask, max_new_tokens=40, eos_token_id=eos,
                                                       pad_token_id=0)
    stats = drafter.last_speculation_stats
    proposed = stats.per_round_proposed
    three = 3 * (stats.row_rounds - 2 * stats.rounds)  # row-rounds of the rounds all three rows ran (then two)
    assert three and max(proposed[:three]) <= CAPPED_DRAFT_LENGTH < max(proposed[three:]), proposed
