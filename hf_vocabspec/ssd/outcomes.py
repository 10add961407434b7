"""Outcome prediction: which (accepted length j, bonus/correction token t) a round's verification may end in.

With a fan-out budget F: at depth j < L the correction token is drawn from norm(max(p - q, 0)), whose mass on
the drafted token is zero (a rejected draft has p < q), so the top-F OTHER tokens of the draft distribution
q_{j+1} are predicted; at depth L (all accepted) the bonus comes from p, predicted by the top-F of the
drafter's next distribution. Under greedy the same rule holds: the correction is the target argmax, never the
drafted token. Outcomes ending in EOS or past the length limit need no next round and are not predicted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Outcome:
    """What verification did with one round: ``accepted`` drafts kept, then ``token`` appended; the sequence
    is ``length`` long after it."""

    accepted: int
    token: int
    length: int

    @property
    def key(self) -> tuple[int, int]:
        """The speculation cache's key (j, t)."""
        return self.accepted, self.token

    @classmethod
    def of_round(cls, input_ids: torch.LongTensor, num_matches: int) -> Outcome:
        """From HF's ``update_candidate_strategy(input_ids, scores, num_matches)`` arguments."""
        return cls(int(num_matches), int(input_ids[0, -1]), int(input_ids.shape[1]))


def predict_outcomes(drafted: torch.Tensor | None, tops: torch.Tensor | None, bonus_top: list[int], ids: torch.Tensor,
                     fan_out: int, eos: set[int], prompt_len: int, max_length: int) -> list[tuple[int, int]]:
    """The (j, t) roots to pre-draft after a round that drafted ``drafted`` (n,) target ids from
    ``prompt_len`` committed tokens.

    ``tops`` (n, F+1): draft indices of each draft's largest q (-1 = zero mass); ``bonus_top``: draft indices
    of the top-F of the drafter's distribution after the last draft (empty when the last draft is EOS);
    ``ids`` maps draft indices to target ids.
    """
    roots = []
    for j in range(0 if drafted is None else drafted.numel()):  # a rejection at depth j
        others = [t for t in (int(ids[i]) for i in tops[j].tolist() if i >= 0) if t != int(drafted[j])]
        roots += [(j, t) for t in others[:fan_out]]
    n = 0 if drafted is None else drafted.numel()
    roots += [(n, int(ids[i])) for i in bonus_top]  # all accepted: the bonus comes from p
    return [(j, t) for j, t in roots if t not in eos and prompt_len + j + 1 < max_length]


def observe_outcome(generator, input_ids: torch.LongTensor, num_matches: int) -> Outcome:
    """Record a round's outcome on an SSD generator (``generator.outcome``) and the time the target took since
    ``get_candidates`` returned (``stats.verify_s``); shared by the inline and the worker generators."""
    if generator.returned_at is not None:
        generator.stats.verify_s += time.perf_counter() - generator.returned_at
        generator.returned_at = None
    generator.outcome = Outcome.of_round(input_ids, num_matches)
    return generator.outcome
