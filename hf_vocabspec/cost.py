"""What one draft step costs as a function of the kept vocabulary size k: FLOPs, and measured latency.

FLOPs are architecture-aware but a proxy: on real hardware the LM head is a memory-bound GEMV whose
latency is not linear in k and has a floor (the body, plus per-layer framework overhead on small
models). So we also time the drafter's step on the actual device at a few k and interpolate.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def draft_flops(config, k: int | None = None, context_length: int = 512) -> dict[str, float]:
    """Forward FLOPs (2 per multiply-add) of ONE decode step, with a k-row LM head.

    Handles GQA (num_key_value_heads), head_dim != hidden/heads, gated MLPs (Llama/Qwen/Gemma), sliding
    window layers (attention over min(context, window) keys), tied or untied heads (same cost).
    """
    c = _text_config(config)
    h = c.hidden_size
    nh = c.num_attention_heads
    nkv = getattr(c, "num_key_value_heads", None) or nh
    d = getattr(c, "head_dim", None) or h // nh
    inter = c.intermediate_size
    layers = c.num_hidden_layers
    gated = getattr(c, "hidden_act", None) is not None or getattr(c, "hidden_activation", None) is not None
    k = c.vocab_size if k is None else k
    layer_types = getattr(c, "layer_types", None) or ["full_attention"] * layers
    window = getattr(c, "sliding_window", None)

    proj = 2 * h * (nh * d) + 2 * 2 * h * (nkv * d) + 2 * (nh * d) * h  # q, k+v, o
    ctx = 0.0
    for t in layer_types[:layers]:
        keys = min(context_length, window) if (t == "sliding_attention" and window) else context_length
        ctx += 2 * 2 * nh * d * keys  # scores q.k and weighted sum of values
    mlp = (3 if gated else 2) * 2 * h * inter
    out = {
        "attention_proj": float(proj * layers),
        "attention_ctx": float(ctx),
        "mlp": float(mlp * layers),
        "lm_head": float(2 * h * k),
    }
    out["total"] = sum(out.values())
    return out


def head_share(config, k: int | None = None, context_length: int = 512) -> float:
    f = draft_flops(config, k, context_length)
    return f["lm_head"] / f["total"]


def flops_ratio_R(config, k: int, context_length: int = 512) -> float:
    """Seed 000's R(k) = 1 - FLOPs(k) / FLOPs(V): the share of draft FLOPs trimming saves."""
    return 1.0 - draft_flops(config, k, context_length)["total"] / draft_flops(config, None, context_length)["total"]


@dataclass
class LatencyCurve:
    """Measured seconds of one cached draft step at kept sizes ``ks``; ``floor_seconds`` = body only."""

    ks: list[int]
    seconds: list[float]
    floor_seconds: float
    device: str = "cpu"
    dtype: str = "float32"
    context_length: int = 128

    def predict(self, k: float) -> float:
        """Piecewise-linear between measured points, from the floor (k=0); extrapolated past the last k.

        Timing noise can make a bigger head look faster; a head never costs less with more rows, so the
        points are made non-decreasing (running maximum) first.
        """
        xs = [0.0, *map(float, self.ks)]
        ys = [self.floor_seconds]
        for t in self.seconds:
            ys.append(max(ys[-1], t))
        if k >= xs[-1]:
            return ys[-1] if len(xs) < 3 else ys[-1] + (k - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if x0 <= k <= x1:
                return y0 + (k - x0) * (y1 - y0) / (x1 - x0) if x1 > x0 else y1
        return ys[0]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> LatencyCurve:
        return cls(**d)

    def plot(self, path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(self.ks, [s * 1e3 for s in self.seconds], "o-", label="draft step (body + k-row head)")
        ax.axhline(self.floor_seconds * 1e3, ls="--", color="gray", label="no-head floor (body only)")
        ax.set_xscale("log")
        ax.set_xlabel("kept vocabulary size k")
        ax.set_ylabel("ms per draft token")
        ax.set_title(f"measured draft-step latency ({self.device}, {self.dtype})")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


@torch.no_grad()
def measure_draft_latency(
    model, ks: Sequence[int], *, context_length: int = 128, repeats: int = 15, warmup: int = 2
) -> LatencyCurve:
    """Time one cached decode step of ``model``'s body plus a k-row head (rows sliced, no trim needed)."""
    from transformers.cache_utils import DynamicCache

    body = model.model if hasattr(model, "model") else model.get_decoder()
    weight = model.get_output_embeddings().weight.detach()
    device = weight.device
    ids = torch.randint(0, weight.shape[0], (1, context_length), device=device, generator=None)
    cache = DynamicCache(config=body.config)
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    body(input_ids=ids, past_key_values=cache, use_cache=True)
    step_ids = ids[:, -1:]
    pos = torch.tensor([[context_length]], device=device)

    def one_step(head: torch.Tensor | None) -> float:
        t0 = time.perf_counter()
        hidden = body(input_ids=step_ids, position_ids=pos, past_key_values=cache, use_cache=True).last_hidden_state
        if head is not None:
            torch.nn.functional.linear(hidden[:, -1], head)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        cache.crop(-1)  # keep the context length fixed
        return dt

    ks = sorted(int(k) for k in ks if k > 0)
    heads = [None] + [weight[: min(k, weight.shape[0])].contiguous() for k in ks]
    for head in heads:
        for _ in range(warmup):
            one_step(head)
    # round-robin over sizes so slow drifts of a noisy machine hit every k alike
    times: list[list[float]] = [[] for _ in heads]
    for _ in range(repeats):
        for i, head in enumerate(heads):
            times[i].append(one_step(head))
    floor, *seconds = (statistics.median(t) for t in times)
    return LatencyCurve(ks, seconds, floor, device=str(device), dtype=str(weight.dtype).removeprefix("torch."),
                        context_length=context_length)
