"""The draft space of one generate call: which target ids the drafter scores, and the target's logits
processors translated to act on those scores.

``DraftVocabulary`` is the K kept head rows plus context tokens; ``draft_space_processors`` maps each of the
target's processors onto draft-space logits (value-only warpers as they are, id-indexed ones through the
draft-index map, unknown ones through the full vocabulary). Both serve the batch-1 candidate generator and the
batched loop; the batched loop shares ONE vocabulary across rows (the union of their context tokens: one head
matmul for the batch, and any q is exact because verification corrects it).
"""

from __future__ import annotations

import warnings

import torch
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    LogitNormalization,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from ..drafter import TrimmedDrafter

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

    def add(self, new: torch.Tensor) -> None:
        """Add the pruned ids among ``new`` (any shape) as context tokens; call between rounds only."""
        if not self.use_context:
            return
        room = self.max_context - self.num_context
        if room <= 0 or new.numel() == 0:
            return
        new = new.reshape(-1)
        new = torch.unique(new[self.t2d[new] < 0])[:room]
        if new.numel() == 0:
            return
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

    def scatter(self, values: torch.Tensor, fill: float = float("-inf")) -> torch.Tensor:
        """(..., K + C) draft-space values -> (..., V) over the target vocabulary."""
        out = values.new_full((*values.shape[:-1], self.drafter.config.vocab_size), fill)
        out[..., self.ids] = values
        return out


class _DraftRepetitionPenalty:
    """RepetitionPenaltyLogitsProcessor on draft-space logits: map context ids to draft indices first."""

    def __init__(self, proc: RepetitionPenaltyLogitsProcessor, vocab: DraftVocabulary):
        self.penalty = proc.penalty
        self.prompt_ignore_length = proc.prompt_ignore_length
        self.vocab = vocab

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        out = scores
        for row in range(input_ids.shape[0]):  # each row penalises its own context
            ids = input_ids[row]
            if isinstance(self.prompt_ignore_length, int):
                ids = ids[self.prompt_ignore_length :]
            elif isinstance(self.prompt_ignore_length, torch.Tensor):
                ids = ids[int(self.prompt_ignore_length[row if self.prompt_ignore_length.numel() > 1 else 0]) :]
            draft_ids = self.vocab.t2d[ids]
            draft_ids = torch.unique(draft_ids[draft_ids >= 0])[None, :]
            picked = out[row : row + 1].gather(1, draft_ids)
            picked = torch.where(picked < 0, picked * self.penalty, picked / self.penalty)
            out = out.clone() if out is scores else out
            out[row : row + 1] = out[row : row + 1].scatter(1, draft_ids, picked)
        return out


class _DraftMinLength:
    """Min-length / min-new-tokens processors: mask the (kept) EOS rows while the sequence is too short."""

    def __init__(self, proc, vocab: DraftVocabulary):
        self.min_length = getattr(proc, "min_length", None)
        self.prompt_length_to_skip = getattr(proc, "prompt_length_to_skip", 0)
        self.min_new_tokens = getattr(proc, "min_new_tokens", None)
        eos = vocab.t2d[proc.eos_token_id.flatten().to(vocab.t2d.device)]  # EOS is always a kept row
        self.eos_draft_ids = eos[eos >= 0]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        if self.min_new_tokens is not None:
            too_short = input_ids.shape[-1] - self.prompt_length_to_skip < self.min_new_tokens
        else:
            too_short = input_ids.shape[-1] < self.min_length
        if too_short and self.eos_draft_ids.numel():
            scores = scores.clone()
            scores[:, self.eos_draft_ids] = float("-inf")
        return scores


class _FullVocabFallback:
    """Any other (id-indexed) processor: apply it on the full vocabulary, read back the kept rows.

    Correct for every processor but O(V) per drafted token; only used for processors we do not know.
    """

    def __init__(self, proc, vocab: DraftVocabulary):
        self.proc = proc
        self.vocab = vocab

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        full = self.vocab.scatter(scores)
        return self.proc(input_ids, full)[..., self.vocab.ids]


def is_value_only(proc) -> bool:
    """Whether a processor reads only logit values (no token ids, no lengths): safe to apply to any rows."""
    return isinstance(proc, _VALUE_ONLY)


def draft_space_processors(logits_processor, vocab: DraftVocabulary) -> list:
    """Translate the target's logits processors to act on draft-space logits (over ``vocab.ids``)."""
    out = []
    for proc in logits_processor or []:
        if isinstance(proc, _VALUE_ONLY):
            out.append(proc)
        elif isinstance(proc, RepetitionPenaltyLogitsProcessor):
            out.append(_DraftRepetitionPenalty(proc, vocab))
        elif isinstance(proc, (MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor)):
            out.append(_DraftMinLength(proc, vocab))
        else:
            warnings.warn(
                f"hf_vocabspec: {type(proc).__name__} is applied to drafts over the full vocabulary "
                "(correct, but O(vocab) per drafted token).",
                stacklevel=3,
            )
            out.append(_FullVocabFallback(proc, vocab))
    return out


