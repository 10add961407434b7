"""Counters of one ``generate`` call with an hf_vocabspec drafter (terms as in vLLM/NeMo).

``add``, ``to_dict`` and ``from_dict`` are derived from the dataclass fields, so a new counter needs one line
(here) and nothing else: numbers add, lists concatenate, flags OR, text fields keep the latest non-empty value (a subclass such as
SSD's stats inherits all of it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class SpeculationStats:
    """What one generate call (or several, via :meth:`add`) did.

    The engine counts per row: ``proposed`` and ``accepted`` sum over rows and rounds, ``row_rounds`` counts
    (row, round) pairs, so ``mean_accepted_length`` stays the per-row tau at every batch size. ``decision`` says
    whether a batched call speculated or fell back to plain decoding (and the measured evidence), ``decisions``
    every switch of the "auto" rule; the ``*_seconds`` fields split its wall time.
    """

    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    draft_steps: int = 0
    pruned_proposed: int = 0  # RDK draws that landed on a pruned token
    context_proposed: int = 0  # drafts of pruned tokens taken from the context (context tokens)
    forced_proposed: int = 0  # drafts the draft constraint's grammar forced (no drafter forward; generation/constraints.py)
    row_rounds: int = 0  # (row, round) pairs; equals rounds at batch 1
    plain_steps: int = 0  # target-only decode steps (the batched loop's fallback or probe; the first step where the
    # drafter took the target's prompt cache)
    batch_size: int = 0
    stepwise: bool = False  # processors with state: called once per generated step (the exact processor contract)
    draft_constraint: str = ""  # the drafter's own copy of the call's grammar (generation/constraints.py), if any
    shared_prompt_cache: bool = False  # the drafter's body is the target's: it took the target's prompt cache
    decision: str = ""  # batched loop: "speculate", "decode (...)", "forced ..."
    target_cache: str = ""  # the target's cache in the engine: "DynamicCache", or "StaticCache" (cache_implementation="static")
    compiled_verify: bool = False  # the target's forwards after the prompt ran its compiled call (static cache + compile)
    compiled_draft: bool = False  # the drafter's forwards after its first ran compiled, on a static cache of its own
    draft_compile_failure: str = ""  # compile_draft_step="auto": why compiling the steps failed (they ran eager)
    kernels: str = ""  # "fast linears on N layers" or "F.linear (why)" (hf_vocabspec.kernels), "; drafter int4 weights on M layers"
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    realign_seconds: float = 0.0  # batched loop: cache realignment and row compaction
    host_syncs: int = 0  # device-to-host reads of the loop (rounds and plain steps; generation/host.py)
    setup_syncs: int = 0  # device-to-host reads made once per call (prompt layout, EOS ids, final counters)
    lagged_reads: int = 0  # the confidence stop's flag read one draft late on a GPU (host.LaggedRead: no device stall)
    confidence_stop: str = ""  # the adapted confidence stop's latest threshold and its evidence (generation/confidence.py)
    decisions: list[str] = field(default_factory=list)  # batched "auto": each switch and its measured evidence
    per_round_accepted: list[int] = field(default_factory=list)
    per_round_proposed: list[int] = field(default_factory=list)

    def add(self, other: SpeculationStats) -> SpeculationStats:
        """Accumulate another call's counters into this one (lists are concatenated)."""
        for f in dataclasses.fields(self):
            if not hasattr(other, f.name):
                continue
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, list):
                mine.extend(theirs)
            elif isinstance(mine, bool) or isinstance(theirs, bool):
                setattr(self, f.name, bool(mine) or bool(theirs))
            elif isinstance(mine, (str, type(None))) or isinstance(theirs, str):
                setattr(self, f.name, theirs or mine)
            elif f.name == "batch_size":
                setattr(self, f.name, max(mine, theirs))
            else:
                setattr(self, f.name, mine + theirs)
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SpeculationStats:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def acceptance_rate(self) -> float:
        """accepted / proposed draft tokens."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """tau = 1 + accepted / verify rounds per row (counts the bonus token)."""
        per = self.row_rounds or self.rounds
        return 1.0 + self.accepted / per if per else 0.0

    @property
    def accepted_length_standard_error(self) -> float | None:
        """Standard error of tau over the recorded rounds (rounds are not independent across a sequence, so
        read it as a lower bound on the noise); None with fewer than 2 recorded rounds."""
        n = len(self.per_round_accepted)
        if n < 2:
            return None
        mean = sum(self.per_round_accepted) / n
        var = sum((a - mean) ** 2 for a in self.per_round_accepted) / (n - 1)
        return (var / n) ** 0.5
