"""Draft cost model: FLOPs against hand counts for several architectures; the measured latency curve."""

from __future__ import annotations

import pytest
import torch
from tiny import gemma3_config, llama_config
from transformers import GPTNeoXConfig, LlamaForCausalLM, MistralConfig, MixtralConfig

from hf_vocabspec.cost import (
    LatencyCurve,
    RoundModel,
    draft_flops,
    head_share,
    iid_acceptance,
    measure_draft_latency,
    project_ssd_speedup,
    speculative_speedup,
    ssd_tokens_per_round,
    tokens_per_round,
)
from hf_vocabspec.evaluation.plots import plot_latency_curve


def test_llama_flops_by_hand():
    c = llama_config()  # h=32, 4 heads, 2 kv heads, head_dim 8 (=32/4), inter 64, 2 layers, vocab 64
    f = draft_flops(c, k=64, context_length=10)
    q = 2 * 32 * (4 * 8)  # 2 FLOPs per multiply-add, h -> heads*head_dim
    kv = 2 * (2 * 32 * (2 * 8))  # k and v: h -> kv_heads*head_dim (GQA)
    o = 2 * (4 * 8) * 32
    assert f["attention_proj"] == 2 * (q + kv + o) == 2 * (2048 + 2048 + 2048)
    assert f["attention_ctx"] == 2 * (2 * 2 * 4 * 8 * 10)  # (q.k + p.v) * heads * head_dim * 10 keys, 2 layers
    assert f["mlp"] == 2 * (3 * 2 * 32 * 64)  # gate, up, down (SiLU-gated)
    assert f["lm_head"] == 2 * 32 * 64
    assert f["total"] == f["attention_proj"] + f["attention_ctx"] + f["mlp"] + f["lm_head"] == 12288 + 2560 + 24576 + 4096
    assert draft_flops(c)["lm_head"] == 2 * 32 * 64  # k defaults to the full vocabulary
    assert draft_flops(c, k=0)["lm_head"] == 0


def test_gemma3_flops_by_hand_sliding_window_and_head_dim():
    # h=32, 4 heads, 1 kv head, head_dim 16 (heads*head_dim = 64 != h = 32), window 4,
    # layers sliding, sliding, full; GELU-tanh gated MLP with I=64
    c = gemma3_config(num_attention_heads=4, num_key_value_heads=1)
    assert c.head_dim == 16 and c.hidden_size // c.num_attention_heads == 8
    f = draft_flops(c, k=10, context_length=100)
    q = 2 * 32 * (4 * 16)  # 4096
    kv = 2 * (2 * 32 * (1 * 16))  # 2048
    o = 2 * (4 * 16) * 32  # 4096
    assert f["attention_proj"] == 3 * (q + kv + o) == 30720
    sliding = 2 * 2 * 4 * 16 * 4  # 1024: the window's 4 keys, not the 100 of the context
    full = 2 * 2 * 4 * 16 * 100  # 25600
    assert f["attention_ctx"] == 2 * sliding + full == 27648
    assert f["mlp"] == 3 * (3 * 2 * 32 * 64) == 36864
    assert f["lm_head"] == 2 * 32 * 10 == 640
    assert f["total"] == 30720 + 27648 + 36864 + 640 == 95872
    assert draft_flops(c, k=10, context_length=3)["attention_ctx"] == 3 * (2 * 2 * 4 * 16 * 3)  # context < window
    assert 0 < head_share(c, 10, 100) < head_share(c, 64, 100) < 1
    assert head_share(c, 64, 100) == pytest.approx(4096 / (95872 - 640 + 4096))


def test_non_gated_moe_and_implicit_sliding_window():
    neox = GPTNeoXConfig(hidden_size=32, num_attention_heads=4, intermediate_size=128, num_hidden_layers=2, vocab_size=50)
    f = draft_flops(neox, k=50, context_length=8)
    assert f["mlp"] == 2 * (2 * 2 * 32 * 128)  # up + down only
    assert f["attention_proj"] == 2 * (4 * 2 * 32 * 32)  # MHA: q, k, v, o all h x h
    assert draft_flops(neox, 50, 8, gated=True)["mlp"] == 2 * (3 * 2 * 32 * 128)
    mix = MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, vocab_size=50)
    assert draft_flops(mix, 50)["mlp"] == 2 * (2 * 32 * 8 + 2 * 3 * 2 * 32 * 64)  # router + 2 active experts
    mistral = MistralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, sliding_window=16, vocab_size=50)
    assert draft_flops(mistral, 50, context_length=1000)["attention_ctx"] == 2 * (2 * 2 * 4 * 8 * 16)


def test_measured_latency_curve_shapes_and_interpolation(tmp_path):
    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config()).eval()
    curve = measure_draft_latency(model, [64, 8, 32, 32], context_length=16, repeats=3, warmup=1)
    assert curve.ks == [8, 32, 64] and len(curve.seconds) == 3 and curve.floor_seconds > 0
    assert curve.vocab_size == 64 and curve.dtype == "float32" and curve.context_length == 16
    assert curve.predict(0) == curve.floor_seconds
    preds = [curve.predict(k) for k in range(0, 129, 4)]
    assert all(b >= a for a, b in zip(preds, preds[1:]))  # never cheaper with more rows, never below the floor
    assert min(preds) == curve.floor_seconds
    lo, hi = curve.predict(8), curve.predict(32)
    assert lo <= curve.predict(20) <= hi
    assert curve.predict(20) == pytest.approx(lo + (hi - lo) * 12 / 24)
    assert curve.relative(64) == 1.0
    assert LatencyCurve.from_dict(curve.to_dict()) == curve
    plot_latency_curve(curve, tmp_path / "lat.png")
    assert (tmp_path / "lat.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.warns(UserWarning, match="exceeds"):
        assert measure_draft_latency(model, [8, 65], context_length=4, repeats=1, warmup=0).ks == [8, 64]


def test_latency_curve_sliding_window_model():
    from tiny import make_pair

    _, drafter = make_pair("gemma3")  # window 4 < context 8: the sliding-layer cache must crop back
    curve = measure_draft_latency(drafter, [16, 64], context_length=8, repeats=2, warmup=1)
    assert len(curve.seconds) == 2 and all(s > 0 for s in curve.seconds)


def test_interpolation_is_monotone_under_noise():
    curve = LatencyCurve(ks=[100, 200, 400], seconds=[0.012, 0.011, 0.02], floor_seconds=0.013)
    assert curve.predict(0) == 0.013 and curve.predict(100) == 0.013 and curve.predict(200) == 0.013
    assert curve.predict(300) == pytest.approx(0.0165)
    assert curve.predict(600) == pytest.approx(0.027)  # last slope extrapolated


def test_speculative_decoding_formulas():
    """tau = (1 - a^(L+1)) / (1 - a); its inverse; speedup = tau / (L c + 1) (Leviathan et al. 2023)."""
    assert tokens_per_round(5, acceptance=1.0) == 6.0
    assert tokens_per_round(1, acceptance=0.5) == pytest.approx(1.5)
    assert tokens_per_round(5, tau=2.5) == 2.5  # a measured tau passes through
    a, drafts = 0.8, 5
    tau = (1 - a ** (drafts + 1)) / (1 - a)
    assert tokens_per_round(drafts, acceptance=a) == pytest.approx(tau)
    assert RoundModel.tokens_per_round is tokens_per_round  # the method is the module's one function
    assert iid_acceptance(tau, drafts) == pytest.approx(a, abs=1e-9)
    assert iid_acceptance(drafts + 1, drafts) == pytest.approx(1.0, abs=1e-6)
    assert speculative_speedup(a, drafts, 0.1) == pytest.approx(tau / 1.5)
    assert speculative_speedup(0.0, drafts, 0.0) == pytest.approx(1.0)


def test_round_model_reproduces_the_three_formulas_it_replaced():
    """speculative_speedup, the benchmark's expected_speedup_theory and ThroughputModel's tokens/s, as written
    before RoundModel (test_tune checks ThroughputModel against its hand formula too)."""
    for a, L, c in [(0.8, 5, 0.1), (0.3, 2, 0.7), (0.95, 8, 0.02)]:
        tau = (1 - a ** (L + 1)) / (1 - a)
        assert RoundModel.from_cost_ratio(c).speedup(L, acceptance=a) == pytest.approx(tau / (L * c + 1), rel=1e-12)
    draft, verify, decode, tau, drafts = 0.004, 0.030, 0.022, 3.1, 4.6  # benchmark: mean drafts per round
    old = tau / (drafts * (draft / verify) + 1) * decode / verify
    assert RoundModel.from_measured(draft, verify, decode).speedup(drafts, tau=tau) == pytest.approx(old, rel=1e-12)
    curve = LatencyCurve([10, 20, 40], [0.004, 0.006, 0.010], 0.003)
    rounds = RoundModel(draft=curve, verify={1: 0.02, 5: 0.028})
    assert rounds.tokens_per_second(4, k=20, tau=3.0) == pytest.approx(3.0 / (4 * 0.006 + 0.028), rel=1e-12)
    assert rounds.speedup(4, k=20, tau=3.0) == pytest.approx(3.0 / (4 * 0.006 + 0.028) * 0.02, rel=1e-12)
    assert rounds.draft_step_seconds() == curve.predict(40)  # no k: the curve's full head


def test_round_model_per_position_acceptance_matches_simulated_rounds():
    """tau from per-position acceptances = mean tokens of simulated rounds (stop at the first rejection, plus
    the bonus token); with one a it is the i.i.d. formula. The simulation would catch a missing bonus token
    or an off-by-one in the product."""
    per_pos = [0.9, 0.7, 0.5, 0.3]
    gen = torch.Generator().manual_seed(0)
    u = torch.rand(200_000, len(per_pos), generator=gen)
    accepted = (u < torch.tensor(per_pos)).int().cumprod(1).sum(1).double()
    simulated = float(accepted.mean()) + 1
    assert RoundModel.tokens_per_round(4, acceptance=per_pos) == pytest.approx(simulated, abs=0.01)
    assert abs(RoundModel.tokens_per_round(4, acceptance=per_pos) - (simulated - 1)) > 0.5  # power: bonus counted
    assert RoundModel.tokens_per_round(5, acceptance=[0.8] * 5) == pytest.approx(tokens_per_round(5, acceptance=0.8))
    with pytest.raises(ValueError, match="one acceptance per draft position"):
        RoundModel.tokens_per_round(3, acceptance=[0.5, 0.5])
    with pytest.raises(ValueError, match="exactly one of tau"):
        RoundModel.tokens_per_round(3)


def test_round_model_batches_and_decides_whether_speculating_pays():
    # per batch size: draft step, verify forward by (positions, batch), plain decode step
    rounds = RoundModel(draft={1: 0.002, 8: 0.004}, verify={(5, 1): 0.020, (5, 8): 0.060},
                        decode={1: 0.018, 8: 0.030})
    assert rounds.round_seconds(4, batch_size=8) == pytest.approx(4 * 0.004 + 0.060)
    assert rounds.tokens_per_second(4, batch_size=8, tau=3.0) == pytest.approx(8 * 3.0 / 0.076)
    assert rounds.plain_tokens_per_second(8) == pytest.approx(8 / 0.030)
    assert rounds.speedup(4, batch_size=1, tau=3.0) == pytest.approx(3.0 / 0.028 * 0.018)  # 1.93x: pays
    assert rounds.fallback_reason(4, batch_size=1, tau=3.0) is None
    reason = rounds.fallback_reason(4, batch_size=8, tau=3.0)  # 1.18x predicted, but asked for a 30% margin
    assert reason is None and rounds.fallback_reason(4, batch_size=8, tau=3.0, margin=0.3) is not None
    line = rounds.fallback_reason(4, batch_size=8, tau=1.5)  # 0.59x: plain decoding wins
    assert line and "\n" not in line and "batch size 8" in line and "0.59x" in line
    with pytest.raises(ValueError, match="batch size 4"):
        rounds.tokens_per_second(4, batch_size=4, tau=2.0)
    with pytest.raises(ValueError, match="measure_verify_latency"):
        rounds.round_seconds(6, batch_size=1)
    # a loop that timed its own steps: one verify median for any position count
    measured = RoundModel.from_measured(0.002, 0.021, 0.018, batch_size=2)
    assert measured.round_seconds(3, batch_size=2) == pytest.approx(3 * 0.002 + 0.021)
    assert measured.fallback_reason(3, batch_size=2, acceptance=0.0) is not None  # tau 1: never pays


def test_round_model_interpolates_verify_and_prices_a_draft_count_distribution():
    rounds = RoundModel(draft=0.01, verify={1: 0.10, 3: 0.12, 5: 0.20})
    assert rounds.verify_step_seconds(2) == pytest.approx(0.11) and rounds.verify_step_seconds(4) == pytest.approx(0.16)
    with pytest.raises(ValueError, match="No verify cost measured for 6"):
        rounds.verify_step_seconds(6)  # beyond the measured counts: never extrapolated
    mixed = rounds.round_seconds({2: 0.5, 4: 0.5})
    assert mixed == pytest.approx(0.5 * (0.02 + 0.12) + 0.5 * (0.04 + 0.20))
    assert rounds.tokens_per_second({2: 0.5, 4: 0.5}, tau=2.5) == pytest.approx(2.5 / mixed)


def test_mean_tokens_per_round_is_tokens_per_round_averaged_over_starts():
    """Every start position's window of per-position acceptances, cut at its segment's end, through the one
    tau function: the vectorized form must agree with it (and with the i.i.d. form on a flat profile)."""
    from hf_vocabspec.cost import mean_tokens_per_round

    gen = torch.Generator().manual_seed(1)
    accept = torch.rand(30, generator=gen, dtype=torch.float64)
    segments, L = [12, 18], 4
    by_start, start = [], 0
    for n in segments:
        for t in range(n):
            window = accept[start + t:start + min(t + L, n)].tolist()
            by_start.append(tokens_per_round(len(window), acceptance=window))
        start += n
    assert mean_tokens_per_round(accept, segments, L) == pytest.approx(sum(by_start) / len(by_start), rel=1e-12)
    flat = torch.full((5000,), 0.7, dtype=torch.float64)
    assert mean_tokens_per_round(flat, [5000], 5) == pytest.approx(tokens_per_round(5, acceptance=0.7), rel=1e-3)


def test_ssd_round_is_modelled_by_the_round_model():
    """SSD's round time and tau (moved from ssd/projection.py): no hit inline is pure overhead; perfect hits
    with t_spec <= t_v on dedicated compute give 1 + L t_d / t_v; backup "none" yields one token on a miss."""
    common = {"draft_step_s": 0.01, "verify_step_s": 0.05, "num_draft_tokens": 5, "tau_sd": 3.0}
    assert project_ssd_speedup(hit_rate=1.0, tree_s=0.04, compute="dedicated", **common).speedup == pytest.approx(2.0)
    assert project_ssd_speedup(hit_rate=0.0, tree_s=0.04, compute="dedicated", **common).speedup == pytest.approx(1.0)
    assert project_ssd_speedup(hit_rate=0.0, tree_s=0.04, compute="sync", **common).speedup < 1.0
    p = project_ssd_speedup(hit_rate=0.8, tree_s=0.07, compute="dedicated", **common)
    assert p.ssd_round_seconds == pytest.approx(0.05 + 0.2 * 0.05 + 0.02) and p.sd_round_seconds == pytest.approx(0.1)
    model = RoundModel.from_measured(0.01, 0.05)
    assert p.ssd_round_seconds == model.ssd_round_seconds(5, hit_rate=0.8, tree_seconds=0.07)
    assert p.sd_round_seconds == model.round_seconds(5)
    assert ssd_tokens_per_round(3.0, 0.5, "none") == pytest.approx(2.0) and ssd_tokens_per_round(3.0, 0.5) == 3.0
    none = project_ssd_speedup(hit_rate=0.5, tree_s=0.0, compute="dedicated", backup="none", **common)
    assert none.measured_inputs["tau_ssd"] == pytest.approx(2.0)
    assert none.ssd_round_seconds == pytest.approx(0.05)  # a miss drafts nothing
    with pytest.raises(ValueError, match="compute must be one of"):
        model.ssd_round_seconds(5, hit_rate=1.0, tree_seconds=0.0, compute="gpu")


# --- a noisy latency curve ------------------------------------------------------------------------------------------
def test_implausible_latency_curve_is_remeasured_then_replaced_by_flops():
    from hf_vocabspec.cli.pipeline import measured_or_flops

    good = LatencyCurve([1024, 49152], [0.020, 0.026], 0.018)
    noisy = LatencyCurve([1024, 49152], [0.030, 0.026], 0.018)  # k=1,024 slower than the full head
    below_floor = LatencyCurve([1024, 49152], [0.020, 0.015], 0.018)  # full head cheaper than the body alone
    assert good.implausibility() is None
    assert "slower than k=49152" in noisy.implausibility()
    assert "faster than the body alone" in below_floor.implausibility()
    model = LlamaForCausalLM(llama_config())
    seq = iter([noisy, good])
    cost, curve, note = measured_or_flops(model, [1024], measure=lambda m, ks: next(seq))
    assert curve is good and cost is good and "second measurement" in note
    seq = iter([noisy, below_floor])
    cost, curve, note = measured_or_flops(model, [1024], measure=lambda m, ks: next(seq))
    assert curve is None and cost is model.config and note.startswith("FLOPs model")
