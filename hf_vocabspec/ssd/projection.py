"""SSD's round-time model: the projected speedup over ordinary speculative decoding (SD) and the rules that
decide, from measured step costs, whether SSD pays or the generator falls back to ordinary drafting.

(To be folded into the package-wide round model, hf_vocabspec.cost, once it exists: the inputs are plain
measured numbers for that reason.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .config import SSDStats

COMPUTES = ("sync", "dedicated")


@dataclass
class SSDProjection:
    """Round-time model of SSD vs ordinary speculative decoding (SD) with the same drafter and L.

    Per round, SD spends T_SD = L t_d + t_v (draft L tokens, then verify). SSD spends
    T_SSD = t_v + (1 - h) t_b + s, where h is the hit rate, t_b the cost of a miss (L t_d for the
    neural backup, 0 for backup "none") and s the part of the tree time t_spec on the critical path:
    s = t_spec when the tree is built inline ("sync"), s = max(0, t_spec - t_v) when the drafter has
    its own compute and builds the tree while the target verifies ("dedicated"). Speedup = (tau_SSD /
    T_SSD) / (tau_SD / T_SD), with tau the tokens per round; with backup "none" a miss round yields one
    token, so tau_SSD = h tau + (1 - h). Saguaro (C < 1) lowers acceptance: pass the measured SSD tau.
    Upper bound, h = 1 and t_spec <= t_v: 1 + L t_d / t_v. All inputs are measured; the output is
    PROJECTED unless the run really had the assumed compute.
    """

    speedup: float
    t_sd_round: float
    t_ssd_round: float
    compute: str  # "sync" | "dedicated"
    measured_inputs: dict = field(default_factory=dict)


def project_speedup(
    *,
    hit_rate: float,
    draft_step_s: float,
    verify_step_s: float,
    tree_s: float,
    num_draft_tokens: int,
    tau_sd: float,
    tau_ssd: float | None = None,
    backup: str = "neural",
    compute: str = "dedicated",
) -> SSDProjection:
    """Projected SSD speedup over ordinary SD from measured h, t_d, t_v, t_spec and tau (see SSDProjection)."""
    if compute not in COMPUTES:
        raise ValueError(f"compute must be one of {COMPUTES}; got {compute!r}.")
    h, L = min(max(hit_rate, 0.0), 1.0), num_draft_tokens
    t_sd = L * draft_step_s + verify_step_s
    t_b = L * draft_step_s if backup == "neural" else 0.0
    s = tree_s if compute == "sync" else max(0.0, tree_s - verify_step_s)
    t_ssd = verify_step_s + (1 - h) * t_b + s
    tau = tau_sd if tau_ssd is None else tau_ssd
    if backup == "none":
        tau = h * tau + (1 - h)
    speedup = (tau / t_ssd) / (tau_sd / t_sd) if t_ssd > 0 and tau_sd > 0 else float("nan")
    inputs = {"hit_rate": h, "draft_step_s": draft_step_s, "verify_step_s": verify_step_s, "tree_s": tree_s,
              "num_draft_tokens": L, "tau_sd": tau_sd, "tau_ssd": tau, "backup": backup}
    return SSDProjection(speedup, t_sd, t_ssd, compute, inputs)


def should_fall_back(stats: SSDStats, num_draft_tokens: int, backup: str, compute: str,
                     hit_rate: float | None = None) -> str | None:
    """A one-line reason when the measured costs say SSD is slower than ordinary SD, else None.

    Compares the modelled round times of :class:`SSDProjection` (same tau; Saguaro's acceptance cost is
    not credited to SSD, so this errs towards falling back). ``hit_rate=1.0`` asks whether even perfect
    outcome prediction could pay (decidable from the first round's costs).
    """
    if stats.inline_draft_steps == 0 or stats.trees == 0:
        return None
    h = stats.hit_rate if hit_rate is None else hit_rate
    proj = project_speedup(hit_rate=h, draft_step_s=stats.draft_step_s,
                           verify_step_s=stats.verify_step_s, tree_s=stats.tree_s,
                           num_draft_tokens=num_draft_tokens, tau_sd=1.0, tau_ssd=1.0, backup=backup,
                           compute=compute)
    if proj.t_ssd_round <= proj.t_sd_round:
        return None
    return (f"SSD cannot pay here ({compute} tree {1e3 * stats.tree_s:.1f} ms vs verify "
            f"{1e3 * stats.verify_step_s:.1f} ms, hit rate {h:.2f}"
            f"{' assumed' if hit_rate is not None else ''}, draft step "
            f"{1e3 * stats.draft_step_s:.1f} ms): falling back to ordinary speculative decoding")


def worker_fallback_reason(stats: SSDStats, num_draft_tokens: int) -> str | None:
    """Worker mode's rule, measured rather than modelled: per round SSD costs t_v' + wait (time blocked on the
    worker), ordinary SD L t_d + t_v. t_v is not measured in an SSD run, so t_v' (verification next to the busy
    worker) stands in for it; where contention slows the target, that favours SSD, so a bench run should still
    compare against ordinary SD (README)."""
    if stats.rounds == 0 or stats.inline_draft_steps == 0:  # nothing measured to compare with yet
        return None
    wait = stats.wait_s / stats.rounds
    jit = num_draft_tokens * stats.draft_step_s
    if wait <= jit:
        return None
    return (f"SSD cannot pay here (waited {1e3 * wait:.1f} ms a round for the drafter worker vs "
            f"{1e3 * jit:.1f} ms to draft {num_draft_tokens} tokens inline, hit rate {stats.hit_rate:.2f}): "
            "falling back to ordinary speculative decoding")
