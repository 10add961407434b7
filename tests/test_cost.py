"""Draft cost model: FLOPs against hand counts for two architectures; the measured latency curve."""

from __future__ import annotations

import torch
from tiny import gemma3_config, llama_config
from transformers import LlamaForCausalLM

from hf_vocabspec.cost import LatencyCurve, draft_flops, flops_ratio_R, head_share, measure_draft_latency


def test_llama_flops_by_hand():
    c = llama_config()  # h=32, 4 heads, 2 kv heads, head_dim 8, inter 64, 2 layers, vocab 64
    f = draft_flops(c, k=64, context_length=10)
    q, kv, o = 2 * 32 * 32, 2 * (2 * 32 * 16), 2 * 32 * 32
    assert f["attention_proj"] == 2 * (q + kv + o)
    assert f["attention_ctx"] == 2 * (4 * 4 * 8 * 10)
    assert f["mlp"] == 2 * (3 * 2 * 32 * 64)
    assert f["lm_head"] == 2 * 32 * 64
    assert f["total"] == f["attention_proj"] + f["attention_ctx"] + f["mlp"] + f["lm_head"]


def test_gemma3_flops_by_hand_sliding_window_and_head_dim():
    c = gemma3_config()  # h=32, 2 heads, 1 kv head, head_dim 16 (!= 32/2), window 4, layers sliding,sliding,full
    f = draft_flops(c, k=10, context_length=100)
    q, kv, o = 2 * 32 * 32, 2 * (2 * 32 * 16), 2 * 32 * 32
    assert f["attention_proj"] == 3 * (q + kv + o)
    assert f["attention_ctx"] == 4 * 2 * 16 * 4 + 4 * 2 * 16 * 4 + 4 * 2 * 16 * 100
    assert f["mlp"] == 3 * (3 * 2 * 32 * 64)
    assert f["lm_head"] == 2 * 32 * 10
    assert 0 < head_share(c, 10) < head_share(c, 64) < 1
    assert flops_ratio_R(c, 64) == 0 and flops_ratio_R(c, 10) > 0


def test_measured_latency_curve_shapes_and_interpolation(tmp_path):
    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config()).eval()
    curve = measure_draft_latency(model, [8, 32, 64], context_length=16, repeats=3, warmup=1)
    assert curve.ks == [8, 32, 64] and len(curve.seconds) == 3 and curve.floor_seconds > 0
    assert curve.predict(0) == curve.floor_seconds
    assert min(curve.seconds[0], curve.seconds[1]) <= curve.predict(20) <= max(curve.seconds[0], curve.seconds[1])
    assert LatencyCurve.from_dict(curve.to_dict()) == curve
    curve.plot(tmp_path / "lat.png")
    assert (tmp_path / "lat.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
