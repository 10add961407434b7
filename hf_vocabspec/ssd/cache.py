"""The speculation cache: pre-drafted branches keyed by the round outcome they continue.

The key is the outcome only, (accepted length j, bonus/correction token t): choosing a branch by its KEY is
unbiased; choosing or cutting one by its CONTENT would not be (branches are cut only at EOS and max length).
Every cached draft carries the law it was drawn from (its branch's own q_C given its prefix).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .outcomes import Outcome


@dataclass
class Drafts:
    """One round's drafts: target ids, the law each was drawn from (draft space, width W), prediction tops."""

    tokens: torch.Tensor  # (n,) target ids
    law: torch.Tensor | None  # (n, W) float32 probabilities (sampling only)
    top: torch.Tensor  # (n, F+1) draft indices of the largest UNSCALED q, -1 where q is zero
    width: int  # W: draft-space width (K + context tokens) when drawn

    def head(self, n: int) -> Drafts:
        """The first ``n`` drafts."""
        return Drafts(self.tokens[:n], None if self.law is None else self.law[:n], self.top[:n], self.width)

    def to(self, device) -> Drafts:
        return Drafts(self.tokens.to(device), None if self.law is None else self.law.to(device), self.top.to(device),
                      self.width)


@dataclass
class Branch(Drafts):
    base_len: int = 0  # sequence length (committed + accepted + bonus) this branch continues


class SpeculationCache:
    """The branches pre-drafted after one round, looked up once with that round's real outcome."""

    def __init__(self):
        self.branches: dict[tuple[int, int], Branch] = {}
        self.ready = False  # a tree was built since the last lookup

    def fill(self, branches: dict[tuple[int, int], Branch]) -> None:
        self.branches, self.ready = branches, True

    def clear(self) -> None:
        self.branches, self.ready = {}, False

    def lookup(self, outcome: Outcome | None, length: int) -> tuple[bool, Branch | None]:
        """(was there a tree to look up, the branch continuing ``outcome`` at sequence ``length`` or None);
        empties the cache either way (one lookup per tree)."""
        looked, branches = self.ready, self.branches
        self.clear()
        if not looked or outcome is None or outcome.length != length:
            return looked, None
        branch = branches.get(outcome.key)
        return looked, branch if branch is not None and branch.base_len == length else None


def full_log_q(drafts: Drafts, ids: torch.Tensor, k: int, rdk, vocab_size: int) -> torch.Tensor:
    """(1, n, V) log of the law the drafts were drawn from, over the target vocabulary (once per round).

    ``ids`` maps draft indices to target ids (append-only, so an older, narrower law maps with its prefix);
    with an RDK kernel the kept part is redistributed exactly (q_RDK = M^T q'), as in ordinary drafting.
    """
    law = drafts.law[None]  # (1, n, W)
    ids = ids[: drafts.width]
    if rdk is not None:
        full = rdk.redistribute(law[..., :k])
        if drafts.width > k:
            full.index_add_(-1, ids[k:], law[..., k:])
        if full.shape[-1] < vocab_size:  # a target padded past the drafter's ids: no mass on its extra rows
            full = torch.nn.functional.pad(full, (0, vocab_size - full.shape[-1]))
    else:
        full = law.new_zeros((*law.shape[:-1], vocab_size))
        full[..., ids] = law
    return full.log()
