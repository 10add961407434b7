"""Joint tuning (evaluation/tune.py): the throughput model/objective (selection.py), its Optuna search with resumable
storage, the measuring driver on tiny models, and the saved choice."""

from __future__ import annotations

import warnings

import pytest
import torch
from tiny import VOCAB, make_pair, random_profile, toy_model

import hf_vocabspec
from hf_vocabspec.cost import LatencyCurve, tokens_per_round
from hf_vocabspec.coverage import TokenCounts
from hf_vocabspec.evaluation.acceptance import ideal_acceptance
from hf_vocabspec.evaluation.data import Conversation
from hf_vocabspec.evaluation.plots import plot_tune_heatmap
from hf_vocabspec.evaluation.tune import (
    acceptance_profile,
    measure_throughput_model,
    save_tuned_drafter,
)
from hf_vocabspec.selection import AcceptanceProfile, ThroughputModel, TuneResult, tune


def brute_tau(profile, k, L, context):
    a = (profile.context if context else profile.vanilla)[:, profile.ks.index(k)].tolist()
    total, start = 0.0, 0
    for n in profile.segments:
        seg = [x * profile.agreement for x in a[start:start + n]]
        start += n
        for t in range(n):
            prod = 1.0
            for j in range(L):
                prod *= seg[t + j] if t + j < n else 0.0
                total += prod
    return 1.0 + total / sum(profile.segments)


def test_profile_tau_is_the_per_position_product():
    profile = random_profile()
    for k in profile.ks:
        for L in (1, 3, 8):
            for ctx in (False, True):
                assert profile.tau(k, L, ctx) == pytest.approx(brute_tau(profile, k, L, ctx), rel=1e-12)
    # constant acceptance, one long conversation: the i.i.d. formula (windows cut at the end barely matter)
    flat = AcceptanceProfile([5], torch.full((20000, 1), 0.7, dtype=torch.float64), None, [20000])
    assert flat.tau(5, 5) == pytest.approx(tokens_per_round(5, acceptance=0.7), rel=1e-3)
    # same mean, but runs of easy and hard tokens: longer drafts pay more than the i.i.d. formula says
    runs = torch.tensor(([1.0] * 10 + [0.4] * 10) * 500, dtype=torch.float64)[:, None]
    bursty = AcceptanceProfile([5], runs, None, [runs.shape[0]])
    assert bursty.tau(5, 8) > tokens_per_round(8, acceptance=0.7) + 0.5
    with pytest.raises(ValueError, match="not scored"):
        profile.tau(11, 3)
    with pytest.raises(ValueError, match="Context tokens were not scored"):
        random_profile(context=False).tau(10, 3, True)


def test_throughput_model_formula_and_errors():
    model = toy_model()
    k, L, ctx = 20, 4, True
    tau = model.acceptance.tau(k, L, ctx)
    assert model.tokens_per_second(k, L, ctx) == pytest.approx(tau / (L * 0.006 + 0.028))
    assert model.speedup(k, L, ctx) == pytest.approx(model.tokens_per_second(k, L, ctx) * 0.020)
    assert len(model.grid()) == 3 * 5 * 2
    with pytest.raises(ValueError, match="missing \\[9\\]"):
        ThroughputModel(model.acceptance, model.draft_latency, {1: 0.02, 3: 0.02}, draft_lengths=[2, 8])


def test_grid_search_finds_the_exact_argmax_and_plots(tmp_path):
    model = toy_model()
    result = tune(model)
    best = max(model.grid(), key=lambda cell: model.tokens_per_second(*cell))
    assert (result.k, result.num_draft_tokens, result.context_tokens, result.confidence_threshold) == best
    assert len(result.trials) == len(model.grid())
    assert result.speedup == pytest.approx(model.speedup(*best))
    plot_tune_heatmap(result, tmp_path / "heat.png", model)
    assert (tmp_path / "heat.png").stat().st_size > 1000


def test_model_is_an_optuna_objective_for_a_users_study():
    import optuna

    model = toy_model()
    with hf_vocabspec.selection.quiet_optuna():
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
        study.optimize(model, n_trials=6)
    t = study.best_trial
    assert t.value == pytest.approx(model.tokens_per_second(t.params["k"], t.params["num_draft_tokens"],
                                                            t.params["context_tokens"]))
    assert "tau" in t.user_attrs


def test_storage_resumes_and_refuses_other_measurements(tmp_path):
    model = toy_model()
    store = tmp_path / "tune.journal"
    first = tune(model, n_trials=5, storage=store, seed=1)
    assert len(first.trials) == 5
    second = tune(model, n_trials=9, storage=store, seed=1)
    assert len(second.trials) == 9 and second.trials[:5] == first.trials  # earlier trials kept
    assert second.study_name == first.study_name
    other = toy_model(random_profile(seed=3))
    assert tune(other, n_trials=3, storage=store, seed=1).study_name != first.study_name  # new measurements: new study
    with pytest.raises(ValueError, match="other settings or measurements"):
        tune(other, n_trials=3, storage=store, seed=1, study_name=first.study_name)


# --- the measuring driver on tiny models ----------------------------------------------------------------
def tiny_conversations(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    convs = []
    for _ in range(n):
        prompt = torch.randint(3, VOCAB, (6,), generator=g)
        answer = torch.cat([prompt[:3], torch.randint(3, VOCAB, (9,), generator=g)])  # repeats: context tokens
        convs.append(Conversation(torch.cat([prompt, answer]), 6))
    return convs


def tiny_counts(seed=0):
    g = torch.Generator().manual_seed(seed)
    return TokenCounts(torch.randint(0, 100, (VOCAB,), generator=g), 10, 10, "tiny")


@pytest.mark.parametrize("mode", ["greedy", "t1", "t0.7"])
def test_profile_agrees_with_the_exact_scorer(mode):
    target, base = make_pair("gemma3", seed=2, head_scale=8.0)
    counts, convs, ks = tiny_counts(), tiny_conversations(), [8, 24, 48]
    profile = acceptance_profile(target, convs, counts, ks, mode=mode)
    temps = () if mode == "greedy" else (float(mode[1:]),)
    ref = ideal_acceptance(target, convs, {str(k): counts.top_k(k) for k in ks}, temperatures=temps)
    name = "greedy" if mode == "greedy" else f"t{float(mode[1:]):g}"
    for i, k in enumerate(ks):
        assert float(profile.vanilla[:, i].mean()) == pytest.approx(ref[str(k)][name], abs=1e-6)
        assert float(profile.context[:, i].mean()) == pytest.approx(ref[str(k)][f"{name}+context"], abs=1e-6)
    assert profile.segments == [c.ids.numel() - c.answer_start for c in convs]
    # the real drafter's agreement: a perturbed copy agrees often but not always
    with_drafter = acceptance_profile(target, convs, counts, ks, mode=mode, drafter=base)
    assert 0.2 < with_drafter.agreement < 1.0
    with pytest.raises(ValueError, match="mode must be"):
        acceptance_profile(target, convs, counts, ks, mode="hot")


def test_measured_model_tunes_and_the_choice_ships_with_the_drafter(tmp_path):
    target, base = make_pair("gemma3", seed=2, head_scale=8.0)
    counts, convs = tiny_counts(), tiny_conversations()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the machine was busy": expected on a shared test machine
        model, record = measure_throughput_model(target, base, convs, counts, [16, 40], draft_lengths=[2, 3],
                                                 repeats=2, context_length=16)
    assert set(record["verify_ms"]) == {"1", "3", "4"} and len(record["load"]) == 2
    # the measured model is the record's numbers: verify seconds per width, the draft curve at the scored ks
    assert model.forward_seconds == {int(n): ms / 1e3 for n, ms in record["verify_ms"].items()}
    assert model.draft_latency.ks == [16, 40] == model.acceptance.ks
    result = tune(model)
    best = max(model.grid(), key=lambda cell: (model.tokens_per_second(*cell), -cell[0], -cell[1], not cell[2], -cell[3]))
    assert (result.k, result.num_draft_tokens, result.context_tokens, result.confidence_threshold) == best  # the exact argmax
    assert result.tokens_per_second == pytest.approx(model.tokens_per_second(*best))
    # ship a fixed choice (context tokens on, L=3, no confidence stop) and check target.generate picks it up
    # with no arguments
    choice = TuneResult(16, 3, True, 1.0, 1.0, [(16, 3, True, 0.0, 1.0)])
    save_tuned_drafter(base, counts, choice, tmp_path / "drafter")
    loaded = hf_vocabspec.TrimmedDrafter.from_pretrained(tmp_path / "drafter").eval()
    assert loaded.generation_config.num_assistant_tokens == 3
    assert loaded.generation_config.assistant_confidence_threshold == 0.0
    assert loaded.config.context_tokens is True and loaded.use_context_tokens
    assert loaded.compile_draft_step is False  # timed eager: saved eager
    assert loaded.config.selection["num_draft_tokens"] == 3 and loaded.config.selection["context_tokens"] is True
    prompt = torch.tensor([[1, 6, 9, 14, 6, 9]])
    ref = target.generate(prompt, do_sample=False, max_new_tokens=20)
    out = target.generate(prompt, do_sample=False, max_new_tokens=20, assistant_model=loaded)
    assert torch.equal(ref, out)
    stats = loaded.last_speculation_stats
    assert max(stats.per_round_proposed) == 3 and stats.draft_steps > stats.rounds



@pytest.mark.skipif(not hf_vocabspec.modeling.quantization_ops_available("int8"), reason="no int8 CPU kernel")
def test_quantized_drafter_is_measured_and_ships_quantized(tmp_path):
    """A quantized base is timed with quantized k-row heads; a tuned int8 choice saves a drafter that loads back
    quantized and keeps greedy output target-only's."""
    from hf_vocabspec.cost import measure_draft_latency
    from hf_vocabspec.modeling import apply_weight_quantization

    target, base = make_pair("gemma3", seed=2, head_scale=8.0)
    quantized = apply_weight_quantization(list(base.modules()), "int8")
    assert quantized > 0
    calls = []
    original = hf_vocabspec.modeling._quantized_forward
    try:
        hf_vocabspec.modeling._quantized_forward = lambda self, x: calls.append(self.out_features) or original(self, x)
        apply_weight_quantization(list(base.modules()), "int8")  # re-bound to the counting forward
        curve = measure_draft_latency(base, [16, 40], context_length=8, repeats=2)
    finally:
        hf_vocabspec.modeling._quantized_forward = original
    assert curve.ks == [16, 40] and 16 in calls and 40 in calls  # the k-row heads ran the int8 kernel
    choice = TuneResult(16, 3, True, 1.0, 1.0, [], weight_quantization="int8")
    save_tuned_drafter(base, tiny_counts(), choice, tmp_path / "drafter")
    loaded = hf_vocabspec.TrimmedDrafter.from_pretrained(tmp_path / "drafter").eval()
    assert loaded.config.weight_quantization == "int8" and loaded.quantized_layers > 0
    assert loaded.config.selection["weight_quantization"] == "int8"
    prompt = torch.tensor([[1, 6, 9, 14, 6, 9]])
    ref = target.generate(prompt, do_sample=False, max_new_tokens=20)
    assert torch.equal(target.generate(prompt, do_sample=False, max_new_tokens=20, assistant_model=loaded), ref)


def test_compiled_draft_steps_are_timed_as_generate_runs_them(monkeypatch):
    """``compile_draft_step``: the drafter's body step is timed through the engine's compiled call with generate's
    options (a real Inductor compile), on the engine's static cache, rolled back to the same context before every
    step (else each timed step would see a longer one), with no graph break; the record says so."""
    from torch._dynamo.utils import counters

    from hf_vocabspec.evaluation.tune import measure_throughput
    from hf_vocabspec.generation import draft_step
    from hf_vocabspec.generation.hooks import draft_compile_options
    from hf_vocabspec.modeling import cache_kwarg

    target, base = make_pair("gemma3", seed=2, head_scale=8.0)  # sliding layers: full-length buffers, as generate
    built, fill = [], []
    real = draft_step.compiled_call

    def spy(module, options):
        built.append((module, options))
        call = real(module, options)

        def run(**kw):
            fill.append(int(kw[cache_kwarg(module)].layers[0].cumulative_length))
            return call(**kw)
        return run

    monkeypatch.setattr(draft_step, "compiled_call", spy)
    breaks = sum(counters["graph_break"].values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the machine was busy": expected on a shared test machine
        model, record, _ = measure_throughput(target, base, tiny_conversations(), tiny_counts(), [16, 40],
                                              draft_lengths=[2, 3], repeats=2, context_length=16,
                                              compile_draft_step=True)
    assert built == [(base.model, draft_compile_options(target))] and built[0][1]["dynamic"] is False
    assert len(fill) >= 3 * 2 and set(fill) == {16}, fill  # (warm-up + repeats) x (body alone + 2 heads)
    assert sum(counters["graph_break"].values()) == breaks
    assert record["compile_draft_step"] is True and all(s > 0 for s in model.draft_latency.seconds)


def test_a_choice_timed_compiled_is_saved_to_run_compiled(tmp_path):
    """``tune --compile-draft-step`` chose for compiled steps: the saved drafter runs them (config.compile_draft_step),
    and generate, picking it up with no argument, keeps target-only's greedy output."""
    from hf_vocabspec.generation.hooks import compiles_draft_step

    target, base = make_pair("llama", seed=2, head_scale=8.0)
    choice = TuneResult(16, 3, False, 1.0, 1.0, [])
    save_tuned_drafter(base, tiny_counts(), choice, tmp_path / "drafter", compile_draft_step=True)
    loaded = hf_vocabspec.TrimmedDrafter.from_pretrained(tmp_path / "drafter").eval()
    assert loaded.compile_draft_step is True and compiles_draft_step(loaded)
    prompt = torch.tensor([[1, 6, 9, 14, 6, 9]])
    ref = target.generate(prompt, do_sample=False, max_new_tokens=12)
    assert torch.equal(target.generate(prompt, do_sample=False, max_new_tokens=12, assistant_model=loaded), ref)
    assert "compiled" in loaded.last_speculation_stats.kernels


def test_drafter_weights_are_tuned_against_one_measurement_of_the_target():
    """Each weights' acceptance and draft latency are measured on their own, the target's verify latencies once
    (identical forward_seconds: measured twice they would differ), and the choice is the most tokens/s."""
    from hf_vocabspec.evaluation.tune import best_weights, tune_drafter_weights

    target, base = make_pair("gemma3", seed=2, head_scale=8.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the machine was busy": expected on a shared test machine
        searched = tune_drafter_weights(target, base, tiny_conversations(), tiny_counts(), [16, 40], [None, "int8"],
                                        draft_lengths=[2, 3], repeats=2, context_length=16)
    assert list(searched) == [None, "int8"]
    (_, m_full, _, r_full), (quantized, m_int8, _, r_int8) = searched[None], searched["int8"]
    assert m_full.forward_seconds == m_int8.forward_seconds
    assert quantized is not base and base.lm_head.__dict__.get("forward") is None  # the base stays as loaded
    assert r_full.weight_quantization is None and r_int8.weight_quantization == "int8"
    best = best_weights(searched)
    assert searched[best][3].tokens_per_second == max(r_full.tokens_per_second, r_int8.tokens_per_second)


def test_card_reports_the_tuned_setting(tmp_path):
    from hf_vocabspec.hub import build_model_card

    _, base = make_pair("gemma3", seed=2)
    drafter = save_tuned_drafter(base, tiny_counts(), TuneResult(16, 7, True, 1.0, 2.5, [], confidence_threshold=0.3),
                                 tmp_path / "d")
    card = build_model_card(drafter)
    header = card.data.to_dict()
    assert header["num_assistant_tokens"] == 7 and header["context_tokens"] is True
    assert header["assistant_confidence_threshold"] == 0.3
    assert drafter.config.selection["confidence_threshold"] == 0.3
    assert "num_draft_tokens" in card.text and "predicted_speedup" in card.text  # the selection table


def test_validation_measures_the_tuned_setting_next_to_its_neighbours():
    from hf_vocabspec.evaluation.tune import (
        format_validation,
        neighbour_ks,
        validate_tuned,
    )

    assert neighbour_ks([8, 16, 32], 16, VOCAB) == [8, 16, 32]
    assert neighbour_ks([8, 16, 32], 32, VOCAB) == [16, 32, VOCAB]  # at the top end: 2k, capped at V
    assert neighbour_ks([8, 16, 32], 8, VOCAB) == [4, 8, 16]
    target, base = make_pair("gemma3", seed=2, head_scale=8.0)
    choice = TuneResult(32, 3, True, 1.0, 1.5, [])
    prompts = [torch.tensor([[1, 6, 9, 14, 6, 9]]), torch.tensor([[1, 7, 7, 20]])]
    v = validate_tuned(target, base, tiny_counts(), choice, prompts, ks=[16, 32], draft_lengths=[2, 3],
                       max_new_tokens=8, generate_kwargs={"do_sample": False})
    assert v["of"] == 4 and 1 <= v["rank"] <= 4 and v["tuned"] == "k=32 L=3"
    assert {r["method"] for r in v["rows"]} == {"k=16 L=2", "k=16 L=3", "k=32 L=2", "k=32 L=3"}
    assert 0 < v["tuned_vs_best"] <= 1.0
    assert "(tuned)" in format_validation(v)


# --- the real trimmed drafter's acceptance along the target's greedy continuation, rounds simulated ---------
def test_simulated_rounds_count_tokens_per_round():
    from hf_vocabspec.cost import simulate_rounds

    def simulated_accepted_length(accept, segments, num_draft_tokens):
        return simulate_rounds(accept, segments, num_draft_tokens).tau

    ones = torch.ones(10, dtype=torch.float64)
    # rounds of 4, 4, then 2: the last drafts only position 8 (position 9, the last, is the target's own token)
    assert simulated_accepted_length(ones, [10], 3) == pytest.approx(10 / 3)
    assert simulated_accepted_length(torch.zeros(7), [7], 5) == 1.0
    a = 0.8
    tau = simulated_accepted_length(torch.full((4000,), a), [4000], 4)
    assert tau == pytest.approx((1 - a ** 5) / (1 - a), rel=2e-3)  # i.i.d. limit
    # rounds restart right after a rejection: a hard token followed by easy ones is not averaged away
    pattern = torch.tensor([1.0, 1.0, 0.0] * 20)
    assert simulated_accepted_length(pattern, [60], 8) == pytest.approx(3.0)


def test_drafter_profile_predicts_the_tau_greedy_generation_measures():
    """Along the target's greedy continuation, greedy rounds of the real trimmed drafter are what the teacher-forced
    per-position accepts say: predicted tau matches the measured one at every k, L and context setting."""
    from hf_vocabspec.configuration import set_draft_length
    from hf_vocabspec.evaluation.tune import drafter_acceptance_profile, target_continuations

    target, base = make_pair("llama", seed=2, head_scale=8.0, noise=0.15)
    counts, n_new, ks = tiny_counts(), 30, [24, 48]
    conts = target_continuations(target, tiny_conversations(n=4), n_new)
    assert all(c.ids.numel() - c.answer_start == n_new for c in conts)
    profile = drafter_acceptance_profile(target, base, conts, counts, ks, mode="greedy", always_kept=[0, 1, 2])
    assert profile.chained_rounds and profile.agreement == 1.0 and profile.segments == [n_new] * 4
    for k in ks:
        drafter = hf_vocabspec.trim_drafter(base, counts.top_k(k))
        for ctx in (False, True):
            drafter.use_context_tokens = ctx
            for L in (3, 8):
                set_draft_length(drafter.generation_config, L)
                accepted = rounds = 0
                for c in conts:
                    prompt = c.ids[: c.answer_start][None]
                    out = target.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                          max_new_tokens=n_new, assistant_model=drafter)
                    assert torch.equal(out[0], c.ids)
                    accepted += drafter.last_speculation_stats.accepted
                    rounds += drafter.last_speculation_stats.rounds
                measured = 1 + accepted / rounds
                assert profile.tau(k, L, ctx) == pytest.approx(measured, rel=0.03), (k, ctx, L)
    sampled = drafter_acceptance_profile(target, base, conts, counts, ks, mode="t1", context_tokens=False)
    assert sampled.context is None and bool(((sampled.vanilla >= 0) & (sampled.vanilla <= 1)).all())


# --- confidence-threshold stops (transformers' assistant_confidence_threshold), simulated from the same forwards --
def test_simulated_rounds_with_a_confidence_threshold():
    from hf_vocabspec.cost import simulate_rounds

    ones = torch.ones(12, dtype=torch.float64)
    sure, unsure = torch.full((12,), 0.9), torch.full((12,), 0.1)
    plain = simulate_rounds(ones, [12], 4)
    assert simulate_rounds(ones, [12], 4, confidence=sure, threshold=0.5) == plain  # never stops early
    # every draft unsure: one draft per round, accepted, 2 tokens a round (rounds start at 0, 2, .., 10)
    stopped = simulate_rounds(ones, [12], 4, confidence=unsure, threshold=0.5)
    assert stopped.drafts == {1: pytest.approx(1.0)} and stopped.tau == pytest.approx(2.0)
    # a rejection at the first draft of each round, sure drafts: the drafter drafts on along its own path (all L)
    reject = torch.zeros(100, dtype=torch.float64)
    r = simulate_rounds(reject, [100], 4, confidence=torch.full((100,), 0.9), threshold=0.5)
    assert r.tau == pytest.approx(1.0) and r.mean_drafts == pytest.approx((96 * 4 + 3 + 2 + 1) / 100)  # short at the end
    # ... past the rejection it stops at the rate measured over all positions (here half of them are unsure)
    conf = torch.tensor([0.9, 0.1] * 50)
    r = simulate_rounds(torch.zeros(100, dtype=torch.float64), [100], 4, confidence=conf, threshold=0.5)
    # rounds start at every position; from a sure one: 1 + (go on w.p. 1/2 each) drafts; from an unsure one: 1
    from_sure = 1 + 0.5 + 0.25 + 0.125
    assert r.tau == pytest.approx(1.0) and r.mean_drafts == pytest.approx((from_sure + 1) / 2, abs=0.05)
    with pytest.raises(ValueError, match="confidence"):
        simulate_rounds(ones, [12], 4, threshold=0.5)


def test_throughput_model_prices_the_draft_count_distribution():
    from hf_vocabspec.cost import RoundYield

    profile = random_profile()
    profile.chained_rounds = True
    profile.vanilla_confidence = profile.vanilla.clone()
    profile.context_confidence = profile.context.clone()
    model = toy_model(profile)
    assert model.threshold_options == [0.0, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert len(model.grid()) == 3 * 5 * 2 * 6
    sim = profile.round_yield(20, 6, True, 0.4)
    assert isinstance(sim, RoundYield) and sim.mean_drafts < 6
    # expected round time over the draft counts; verify at unmeasured counts interpolated between measured ones
    verify = {1: 0.020, 2: 0.021, **{n + 1: 0.020 + 0.002 * n for n in (2, 3, 4, 6, 8)}}
    seconds = sum(p * (d * 0.006 + verify.get(d + 1, 0.020 + 0.002 * d)) for d, p in sim.drafts.items())
    assert model.tokens_per_second(20, 6, True, 0.4) == pytest.approx(sim.tau / seconds, rel=0.02)
    no_conf = toy_model(random_profile())
    assert no_conf.threshold_options == [0.0]
    with pytest.raises(ValueError, match="no drafter confidence"):
        no_conf.acceptance.round_yield(20, 3, True, 0.4)
    with pytest.raises(ValueError, match="in \\[0, 1\\)"):
        ThroughputModel(profile, model.draft_latency, model.forward_seconds, draft_lengths=[2],
                        confidence_thresholds=[1.5])


def test_drafter_profile_predicts_confidence_stopped_rounds():
    """With a confidence threshold, greedy generation's tau is exactly the simulated one (the stops along the
    target's path are observed) and its draft count close to it (past a rejection the stop rate is modelled)."""
    from hf_vocabspec.configuration import set_draft_length
    from hf_vocabspec.evaluation.tune import drafter_acceptance_profile, target_continuations

    target, base = make_pair("llama", seed=2, head_scale=8.0, noise=0.15)
    counts, n_new, k = tiny_counts(), 30, 48
    conts = target_continuations(target, tiny_conversations(n=4), n_new)
    profile = drafter_acceptance_profile(target, base, conts, counts, [k], mode="greedy", always_kept=[0, 1, 2])
    assert profile.has_confidence and float(profile.vanilla_confidence.min()) > 0
    drafter = hf_vocabspec.trim_drafter(base, counts.top_k(k))
    drafter.adapt_confidence_threshold = False  # the simulated stop is the configured one (generation/confidence.py)
    # thresholds inside the tiny drafter's confidence range (its distributions are flat), so rounds stop early
    # sometimes, not always
    conf = profile.vanilla_confidence.flatten()
    thresholds = [float(conf.quantile(0.2)), float(conf.quantile(0.5))]
    for ctx in (False, True):
        drafter.use_context_tokens = ctx
        for L, t in ((8, thresholds[0]), (8, thresholds[1]), (5, thresholds[0])):
            set_draft_length(drafter.generation_config, L, t)
            accepted = rounds = proposed = 0
            for c in conts:
                prompt = c.ids[: c.answer_start][None]
                out = target.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                      max_new_tokens=n_new, assistant_model=drafter)
                assert torch.equal(out[0], c.ids)
                st = drafter.last_speculation_stats
                accepted, rounds, proposed = accepted + st.accepted, rounds + st.rounds, proposed + st.proposed
            sim = profile.round_yield(k, L, ctx, t)
            assert sim.tau == pytest.approx(1 + accepted / rounds, rel=0.03), (ctx, L, t)
            assert sim.mean_drafts == pytest.approx(proposed / rounds, rel=0.15), (ctx, L, t)
            assert 1 < proposed / rounds < L - 1  # the threshold stopped some rounds early, not all
            # power: a model that ignored the threshold would be far off
            assert profile.round_yield(k, L, ctx).mean_drafts > 1.5 * proposed / rounds
    with pytest.raises(ValueError, match="confidence_threshold must be in"):
        set_draft_length(drafter.generation_config, 3, 1.0)


def test_other_load_counts_other_processes_not_the_measurement(monkeypatch):
    """The arithmetic on controlled readings (/proc/stat busy seconds, own CPU seconds, wall clock), so the test does
    not depend on a quiet machine; the real readers only have to give sane numbers under any load."""
    import os
    import types

    from hf_vocabspec.evaluation import tune
    from hf_vocabspec.evaluation.tune import OtherLoad

    def readings(busy, own, wall):
        busy, own, wall = iter(busy), iter(own), iter(wall)
        monkeypatch.setattr(OtherLoad, "_machine_busy_seconds", staticmethod(lambda: next(busy)))
        monkeypatch.setattr(OtherLoad, "_own_seconds", staticmethod(lambda: next(own)))
        monkeypatch.setattr(tune, "time", types.SimpleNamespace(perf_counter=lambda: next(wall)))

    readings(busy=[100.0, 102.0], own=[10.0, 12.0], wall=[0.0, 1.0])  # the measurement alone used both cores
    with OtherLoad() as own:
        pass
    readings(busy=[100.0, 103.5], own=[10.0, 12.0], wall=[0.0, 1.0])  # others used 1.5 cores beside it
    with OtherLoad(threshold=0.5) as other:
        pass
    readings(busy=[100.0, 100.4], own=[10.0, 11.0], wall=[0.0, 1.0])  # clock ticks: own time above the machine's
    with OtherLoad() as ticks:
        pass
    readings(busy=[None, None], own=[10.0, 10.0], wall=[0.0, 1.0])  # no /proc/stat
    with OtherLoad() as nowhere:
        pass
    monkeypatch.setattr(tune.os, "cpu_count", lambda: 2)
    assert own.cores == 0.0 and not own.busy
    assert other.cores == pytest.approx(1.5) and other.busy  # 1.5 > 0.5 x 2 cores
    assert ticks.cores == 0.0
    assert nowhere.cores is None and not nowhere.busy
    monkeypatch.undo()
    with OtherLoad() as real:  # the real readers: whatever else runs, a number of cores, never negative
        sum(range(100_000))
    assert real.cores is None or 0.0 <= real.cores <= (os.cpu_count() or 1) * 4


def test_sampled_profile_predicts_the_tau_sampling_measures():
    """T=1: rounds simulated from min(1, q(x)/p(x)) along the target's sampled continuations predict the tau of
    sampled speculative generation (many rounds; threshold: 4 standard errors of the measured tau). Power: the
    same simulation from a deliberately wrong q fails that threshold."""
    from hf_vocabspec.configuration import set_draft_length
    from hf_vocabspec.evaluation.tune import drafter_acceptance_profile, target_continuations
    from hf_vocabspec.generation.stats import SpeculationStats
    from hf_vocabspec.cost import simulate_rounds

    target, base = make_pair("llama", seed=3, head_scale=20.0, noise=0.6)
    counts, n_new, k, L = tiny_counts(), 24, VOCAB, 3
    convs = tiny_conversations(n=40, seed=5)
    conts = target_continuations(target, convs, n_new, mode="t1", seed=1)
    profile = drafter_acceptance_profile(target, base, conts, counts, [k], mode="t1", context_tokens=False)
    predicted = profile.tau(k, L)
    drafter = hf_vocabspec.trim_drafter(base, counts.top_k(k))
    set_draft_length(drafter.generation_config, L)
    stats = SpeculationStats()
    torch.manual_seed(11)
    for c in convs:
        prompt = c.ids[: c.answer_start][None]
        for _ in range(3):
            target.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, temperature=1.0, top_k=0,
                            max_new_tokens=n_new, assistant_model=drafter)
            stats.add(drafter.last_speculation_stats)
    measured, se = stats.mean_accepted_length, stats.accepted_length_standard_error
    assert abs(predicted - measured) < 4 * se, (predicted, measured, se)
    # power: the same simulation from a deliberately wrong q (the acceptance ratio inverted, min(1, p(x)/q(x)))
    # is refused by the same threshold
    wrong = []
    for c in conts:
        p = target(input_ids=c.ids[None]).logits[0, c.answer_start - 1:-1].softmax(-1)
        q = base(input_ids=c.ids[None]).logits[0, c.answer_start - 1:-1].softmax(-1)
        path = c.ids[c.answer_start:, None]
        wrong.append((p.gather(1, path) / q.gather(1, path)).clamp(max=1.0)[:, 0].detach())
    wrong_tau = simulate_rounds(torch.cat(wrong), profile.segments, L).tau
    assert abs(wrong_tau - measured) > 4 * se, (wrong_tau, measured, se)
