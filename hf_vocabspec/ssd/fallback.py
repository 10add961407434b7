"""When SSD falls back to ordinary speculative decoding: the rules that read one run's measured costs
(:class:`~hf_vocabspec.ssd.config.SSDStats`). The round-time model they apply is hf_vocabspec.cost's
(:meth:`~hf_vocabspec.cost.RoundModel.ssd_round_seconds`, :func:`~hf_vocabspec.cost.project_ssd_speedup`):
this module holds no formula of its own."""

from __future__ import annotations

from ..cost import RoundModel
from .config import SSDStats

__all__ = ["should_fall_back", "worker_fallback_reason"]


def should_fall_back(stats: SSDStats, num_draft_tokens: int, backup: str, compute: str,
                     hit_rate: float | None = None) -> str | None:
    """A one-line reason when the measured costs say SSD is slower than ordinary SD, else None.

    Compares the modelled round times (:meth:`RoundModel.round_seconds` vs :meth:`RoundModel.ssd_round_seconds`,
    same tau; Saguaro's acceptance cost is not credited to SSD, so this errs towards falling back).
    ``hit_rate=1.0`` asks whether even perfect outcome prediction could pay (decidable from the first round's
    costs).
    """
    if stats.inline_draft_steps == 0 or stats.trees == 0:
        return None
    h = stats.hit_rate if hit_rate is None else hit_rate
    model = RoundModel.from_measured(stats.draft_step_s, stats.verify_step_s)
    ssd = model.ssd_round_seconds(num_draft_tokens, hit_rate=h, tree_seconds=stats.tree_s, backup=backup,
                                  compute=compute)
    if ssd <= model.round_seconds(num_draft_tokens):
        return None
    return (f"SSD cannot pay here ({compute} tree {1e3 * stats.tree_s:.1f} ms vs verify "
            f"{1e3 * stats.verify_step_s:.1f} ms, hit rate {h:.2f}"
            f"{' assumed' if hit_rate is not None else ''}, draft step "
            f"{1e3 * stats.draft_step_s:.1f} ms): falling back to ordinary speculative decoding")


def worker_fallback_reason(stats: SSDStats, num_draft_tokens: int) -> str | None:
    """Worker mode's rule, measured rather than modelled: per round SSD costs t_v' + wait (time blocked on the
    worker), ordinary SD L t_d + t_v (:meth:`RoundModel.round_seconds`). t_v is not measured in an SSD run, so
    t_v' (verification next to the busy worker) stands in for it; where contention slows the target, that
    favours SSD, so a bench run should still compare against ordinary SD (README)."""
    if stats.rounds == 0 or stats.inline_draft_steps == 0:  # nothing measured to compare with yet
        return None
    wait = stats.wait_s / stats.rounds
    model = RoundModel.from_measured(stats.draft_step_s, stats.verify_step_s)
    verify = model.verify_step_seconds(num_draft_tokens + 1)
    if verify + wait <= model.round_seconds(num_draft_tokens):
        return None
    jit = model.round_seconds(num_draft_tokens) - verify  # the L draft steps SSD saves
    return (f"SSD cannot pay here (waited {1e3 * wait:.1f} ms a round for the drafter worker vs "
            f"{1e3 * jit:.1f} ms to draft {num_draft_tokens} tokens inline, hit rate {stats.hit_rate:.2f}): "
            "falling back to ordinary speculative decoding")
