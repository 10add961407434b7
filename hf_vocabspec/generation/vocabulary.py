"""The draft space of one generate call: which target ids the drafter scores.

``DraftVocabulary`` is the K kept head rows plus context tokens. A batch shares ONE vocabulary across rows (the
union of their context tokens: one head matmul for the batch, and any q is exact because verification corrects
it). The processors acting on draft-space logits live with the draft step (:mod:`.draft_step`).
"""

from __future__ import annotations

import torch
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    InfNanRemoveLogitsProcessor,
    LogitNormalization,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from ..modeling import TrimmedDrafter
from .host import read, upload

# Processors that only look at logit VALUES (not token ids): valid as-is on the K kept logits.
_VALUE_ONLY = (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    MinPLogitsWarper,
    TypicalLogitsWarper,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    LogitNormalization,
)
try:  # newer transformers
    from transformers.generation.logits_process import TopHLogitsWarper

    _VALUE_ONLY = (*_VALUE_ONLY, TopHLogitsWarper)
except ImportError:  # pragma: no cover
    pass


class DraftVocabulary:
    """The target ids one round drafts over: the K kept head rows, then (optionally) context tokens.

    Context tokens are pruned ids that already occur in the sequence (prompt or generated text): on chat
    text about 63% of the occurrences of pruned tokens are such repeats (names, identifiers, rare words;
    measured on ShareGPT, SmolLM2 and Gemma-3 tokenizers). Their head rows come from the tied embedding
    matrix, so the drafter scores them exactly like the untrimmed model would. The set only grows between
    rounds (append-only, capped), is fixed while a round drafts, and the round's q is a proper
    distribution over ``ids``: verification stays exact. Cost: O(new tokens) per round to update,
    O(K + C) per drafted token; the O(V) id lookup ``t2d`` is copied once per generate call, on first use.
    """

    def __init__(self, drafter: TrimmedDrafter, use_context: bool, max_context: int):
        if use_context and not drafter.supports_context_tokens:
            drafter.context_head_rows(drafter.d2t[:0])  # raises the explanatory error
        self.drafter = drafter
        self.k = int(drafter.d2t.numel())
        self.ids = drafter.d2t  # (K + C,) target id of every draft index
        self.t2d = drafter.t2d  # target id -> draft index or -1; becomes a private copy once C is non-empty
        self.use_context = use_context
        self.max_context = max_context
        self.context_rows: torch.Tensor | None = None  # (C, hidden) head rows of the context tokens
        self.scanned = 0
        self._known: set[int] | None = None  # host copy of ``ids`` for ``add_ids`` (read once, then kept in step)

    @property
    def num_context(self) -> int:
        return self.ids.numel() - self.k

    def update(self, input_ids: torch.LongTensor) -> None:
        """Add pruned ids first seen in row 0 of ``input_ids`` since the last call (batch-1 generator)."""
        if not self.use_context:
            return
        new = input_ids[0, self.scanned :]
        self.scanned = input_ids.shape[1]
        self.add(new)

    def add(self, new: torch.Tensor, stats=None) -> None:
        """Add the pruned ids among ``new`` (any shape) as context tokens; call between rounds only. One read of
        ``new`` (counted in ``stats`` as a per-call read), then :meth:`add_ids`."""
        if self.use_context and new.numel() and self.num_context < self.max_context:
            self.add_ids(read(new.reshape(-1), stats, setup=True), stats)

    def add_ids(self, new: list[int], stats=None) -> None:
        """Add the pruned ids among the host list ``new`` (the engine's emitted tokens) as context tokens, at most
        up to ``max_context``, in ascending id order: they are found on the host, against a copy of ``ids`` read
        once per call; no device read per round."""
        if not self.use_context:
            return
        room = self.max_context - self.num_context
        if room <= 0 or not new:
            return
        if self._known is None:
            self._known = set(read(self.ids, stats, setup=True))
        size = self.t2d.numel()
        fresh = sorted({t for t in new if 0 <= t < size and t not in self._known})[:room]
        if not fresh:
            return
        self._known.update(fresh)
        self._append(upload(fresh, self.ids.device))

    def _append(self, new: torch.Tensor) -> None:
        if self.t2d is self.drafter.t2d:
            self.t2d = self.t2d.clone()
        self.t2d[new] = torch.arange(self.ids.numel(), self.ids.numel() + new.numel(), device=new.device)
        self.ids = torch.cat([self.ids, new])
        rows = self.drafter.context_head_rows(new)
        self.context_rows = rows if self.context_rows is None else torch.cat([self.context_rows, rows])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits over ``ids``: the trimmed head, then the context tokens' rows."""
        kept = self.drafter.draft_logits(hidden)
        if self.context_rows is None:
            return kept
        extra = self.drafter._head_transform(hidden @ self.context_rows.T)
        return torch.cat([kept, extra], dim=-1)

    def scatter(self, values: torch.Tensor, fill: float = float("-inf"), size: int | None = None) -> torch.Tensor:
        """(..., K + C) draft-space values -> (..., V) over the target vocabulary (``size``: a padded target's)."""
        out = values.new_full((*values.shape[:-1], size or self.drafter.config.vocab_size), fill)
        out[..., self.ids] = values
        return out

    def draft_index(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Draft index of each target id, -1 where it has none (pruned, or past the drafter's ids)."""
        inside = target_ids < self.t2d.numel()
        return torch.where(inside, self.t2d[target_ids.clamp(max=self.t2d.numel() - 1)], -1)


# THE list of processors known to be stateless: each is a pure function of (input_ids, scores) (read from
# transformers' sources: they keep no per-call or per-row state beyond lazily derived constants), so calling it
# on positions that are later rejected, twice for one step, or per distinct row length is harmless, and the engine
# may process a round's verified positions all at once. EVERY other processor (the caller's own,
# ``prefix_allowed_tokens_fn``'s user function, xgrammar, outlines, lm-format-enforcer, watermarking with state)
# is called exactly as target-only generate calls it: once per generated step (engine.py, "stepwise").
_STATELESS = (
    *_VALUE_ONLY,
    RepetitionPenaltyLogitsProcessor,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    NoBadWordsLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    InfNanRemoveLogitsProcessor,
)


def is_stateless(proc) -> bool:
    """Whether a processor is one of transformers' own that is a pure function of (ids, scores) (exact type: a
    subclass may add state)."""
    return type(proc) in _STATELESS


def is_value_only(proc) -> bool:
    """Whether a processor reads only logit values (no token ids, no lengths): safe to apply to any rows."""
    return isinstance(proc, _VALUE_ONLY)
