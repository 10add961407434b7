"""SSD's settings (:class:`SSDConfig`), its counters (:class:`SSDStats`) and the one place an SSD generator's
draft length is fixed (:func:`fix_draft_length`)."""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import InitVar, dataclass

from .._io import first_line
from ..configuration import capped_draft_length, check_draft_length
from ..cost import SSD_BACKUPS as BACKUPS
from ..generation import SpeculationStats

__all__ = ["BACKUPS", "MODES", "SSDConfig", "SSDStats", "check_device", "fix_draft_length"]

MODES = ("sync", "worker")


@dataclass
class SSDConfig:
    """Settings of one SSD session.

    fan_out: predicted outcomes per depth (F); ``saguaro_scale``: C in (0, 1] (1 = plain sampling from q);
    ``backup``: what a miss does ("neural": just-in-time drafting; "none": no draft that round);
    ``num_draft_tokens``: the draft length L, the tree's depth (None = the drafter's generation_config or
    generate()'s ``num_assistant_tokens``, transformers' name for it, capped at CAPPED_DRAFT_LENGTH where that L is
    a cap for a confidence-stopped schedule, as a freshly trimmed drafter's is; ``num_assistant_tokens=`` is still
    accepted here, as the old name of this field, and warns); ``mode``:
    "sync" or "worker"; ``device``/``draft_threads``: where the worker's drafter runs and its torch threads;
    ``fallback``: switch to ordinary drafting when the measured costs say SSD cannot pay, decided after
    ``probe_rounds`` rounds; ``worker_timeout_s``: longest wait for a worker reply before the session gives
    the worker up and drafts in this process.
    """

    fan_out: int = 3
    saguaro_scale: float = 1.0
    backup: str = "neural"
    num_draft_tokens: int | None = None
    mode: str = "sync"
    device: str | None = None
    draft_threads: int = 1
    fallback: bool = True
    probe_rounds: int = 8
    worker_timeout_s: float = 120.0
    # the old name of num_draft_tokens: accepted at construction, with a warning (not an attribute: an InitVar,
    # so dataclasses.replace and to_dict see num_draft_tokens only)
    num_assistant_tokens: InitVar[int | None] = None

    def __post_init__(self, num_assistant_tokens: int | None = None):
        if num_assistant_tokens is not None:
            if self.num_draft_tokens is not None and self.num_draft_tokens != num_assistant_tokens:
                raise ValueError(f"SSDConfig got num_draft_tokens={self.num_draft_tokens!r} and its old name "
                                 f"num_assistant_tokens={num_assistant_tokens!r}: pass num_draft_tokens only.")
            warnings.warn("SSDConfig(num_assistant_tokens=) is now SSDConfig(num_draft_tokens=) (the draft length L); "
                          "the old name still works.", DeprecationWarning, stacklevel=3)
            self.num_draft_tokens = num_assistant_tokens
        if isinstance(self.fan_out, bool) or not isinstance(self.fan_out, int) or self.fan_out < 1:
            raise ValueError(f"SSDConfig.fan_out must be an integer >= 1 (outcomes predicted per depth); got {self.fan_out!r}.")
        c = self.saguaro_scale
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or not 0 < c <= 1:
            raise ValueError(f"SSDConfig.saguaro_scale must be in (0, 1] (1 = plain sampling); got {c!r}.")
        if self.backup not in BACKUPS:
            raise ValueError(f"SSDConfig.backup must be one of {BACKUPS}; got {self.backup!r}.")
        if self.num_draft_tokens is not None:
            try:
                check_draft_length(self.num_draft_tokens)
            except ValueError:
                raise ValueError(f"SSDConfig.num_draft_tokens must be a positive integer (got {self.num_draft_tokens!r}): "
                                 "the drafter drafts that many tokens per round; None means the drafter's own.") from None
        if self.mode not in MODES:
            raise ValueError(f"SSDConfig.mode must be one of {MODES}; got {self.mode!r}.")
        if isinstance(self.draft_threads, bool) or not isinstance(self.draft_threads, int) or self.draft_threads < 1:
            raise ValueError(f"SSDConfig.draft_threads must be an integer >= 1; got {self.draft_threads!r}.")
        if isinstance(self.probe_rounds, bool) or not isinstance(self.probe_rounds, int) or self.probe_rounds < 1:
            raise ValueError(f"SSDConfig.probe_rounds must be an integer >= 1; got {self.probe_rounds!r}.")
        if self.device is not None:
            check_device(self.device, "SSDConfig.device")
        t = self.worker_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
            raise ValueError(f"SSDConfig.worker_timeout_s must be > 0 seconds; got {t!r}.")

    def to_dict(self) -> dict:
        """Plain JSON-able values (what the worker receives)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SSDConfig:
        """An SSDConfig from :meth:`to_dict`'s values; the old key ``num_assistant_tokens`` is read as
        ``num_draft_tokens`` (no warning: a stored dict is not the caller's choice of words)."""
        data = dict(data)
        old = data.pop("num_assistant_tokens", None)
        if old is not None and data.get("num_draft_tokens") is None:
            data["num_draft_tokens"] = old
        return cls(**data)



def check_device(device: object, what: str) -> None:
    """A device the worker's drafter can move to: named as torch names it, and present on this machine (checked
    here, in one line, instead of a traceback from the worker process)."""
    import torch

    fix = "pass 'cpu', 'cuda', 'cuda:N' or another device torch has here, or None (the drafter's own device)"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"{what} {device!r} is not a torch device name: {fix}.") from None
    if dev.type == "cuda":  # counted without creating a CUDA context in this process (the worker makes its own)
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (dev.index or 0) >= count:
            raise ValueError(f"{what} {device!r} is not available on this machine ({count} CUDA device(s) here): "
                             f"{fix}.")
        return
    try:
        torch.empty(0, device=dev)
    except (RuntimeError, AssertionError, ValueError) as err:  # backend missing or not built in
        raise ValueError(f"{what} {device!r} is not available on this machine ({first_line(err, 120)}): {fix}.") from None


def fix_draft_length(generator, ssd_config: SSDConfig) -> int:
    """Give an SSD-session generator its draft length L: ``ssd_config.num_draft_tokens`` when set (else the
    value the generator already resolved from generate()/the drafter, capped where it is a cap for a confidence
    stop: configuration.capped_draft_length), a constant schedule and no confidence stop (L is the tree depth;
    drafts are cut only at EOS and max length). The one home of the SSD override.
    (``generator.num_assistant_tokens`` is transformers' candidate-generator attribute: its name is kept.)"""
    if ssd_config.num_draft_tokens is not None:
        generator.num_assistant_tokens = ssd_config.num_draft_tokens
    else:
        generator.num_assistant_tokens = capped_draft_length(generator.num_assistant_tokens,
                                                          generator.assistant_confidence_threshold or 0.0)
    generator.num_assistant_tokens = int(generator.num_assistant_tokens)
    generator.assistant_generation_config.num_assistant_tokens_schedule = "constant"
    generator.assistant_confidence_threshold = 0.0
    return generator.num_assistant_tokens


@dataclass
class SSDStats(SpeculationStats):
    """Counters of one SSD ``generate`` call (times in seconds, wall clock, on the process that spent them)."""

    mode: str = "sync"
    lookups: int = 0  # rounds that had a speculation cache to look up (every round after the first)
    hits: int = 0
    trees: int = 0
    tree_branches: int = 0
    tree_steps: int = 0
    inline_draft_s: float = 0.0  # just-in-time drafting (on the critical path)
    inline_draft_steps: int = 0
    predraft_s: float = 0.0  # glue forward + tree decoding (hidden behind verification in worker mode)
    verify_s: float = 0.0  # get_candidates returned -> update_candidate_strategy (target forward + verify)
    wait_s: float = 0.0  # worker mode: time the main process waited for the worker's reply
    fell_back: bool = False
    fallback_reason: str | None = None

    @property
    def hit_rate(self) -> float:
        """hits / lookups (the first round has nothing cached and is not counted)."""
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def draft_step_s(self) -> float:
        """Mean seconds of one just-in-time draft step (t_d)."""
        return self.inline_draft_s / self.inline_draft_steps if self.inline_draft_steps else 0.0

    @property
    def tree_s(self) -> float:
        """Mean seconds to pre-draft one round's tree (t_spec = glue + L tree steps)."""
        return self.predraft_s / self.trees if self.trees else 0.0

    @property
    def verify_step_s(self) -> float:
        """Mean seconds of one verification step as seen by the candidate generator (t_v)."""
        return self.verify_s / self.rounds if self.rounds else 0.0
