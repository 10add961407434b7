"""Draft constraints: a grammar that guides the DRAFTS, without touching the caller's processor.

The caller's structured-generation processor (xgrammar, outlines) holds per-row state that belongs to the target:
only verification calls it, exactly as target-only generate does (engine.py, "stepwise"). Unconstrained drafts,
though, waste rounds wherever the grammar forbids what the drafter likes (a quote, a brace, a digit). A draft
constraint is the drafter's OWN copy of the grammar state, built from what the caller's processor holds
(xgrammar's compiled grammars, outlines' index) and never sharing its state:

    begin(rows)              once per call, before the first draft (rows: the batch's original row count)
    allowed(row) -> (V,) bool over target ids, or None (unconstrained: finished, or lost its way)
    accept(row, token) -> bool   advance the row by one token (a draft, or a decided token); False: not allowed
    rollback(row, n)         take back the row's last n accepted tokens
    forced(row) -> list[int] (optional) target ids the grammar determines from here, in the tokenization the
                             model most likely emits; the engine drafts them without a drafter forward

Any object with the first four methods is a draft constraint (a client can implement it); :func:`draft_constraint_for`
builds one for the clients we know. The engine keeps each row's constraint on the row's sequence (decided tokens
plus its undecided drafts) by rolling back what verification dropped. The output never depends on it: it only
changes which drafts are proposed (q is the law they were drawn from, masked included), so it costs or saves
acceptance, never exactness.
"""

from __future__ import annotations

import torch

# Rollback depth outlines' draft guides keep (a row's undecided drafts plus one round's; xgrammar's is unlimited).
MAX_ROLLBACK = 64


_LOOKUPS: dict[int, tuple] = {}  # XgrammarDraft.forced: one spelling table (its grammar kept alive with it)


def _unpack(bitmask: torch.Tensor, size: int) -> torch.Tensor:
    """(W,) int32 bitmask (bit j of word w: token 32w + j allowed) -> (size,) bool."""
    bits = torch.arange(32, dtype=torch.int32)
    return ((bitmask[:, None] >> bits) & 1).bool().reshape(-1)[:size]


class XgrammarDraft:
    """Draft constraint from ``xgrammar.contrib.hf.LogitsProcessor``: fresh matchers on its compiled grammars."""

    def __init__(self, processor):
        import xgrammar

        self.xgr = xgrammar
        self.grammars = list(processor.compiled_grammars)
        self.size = int(processor.full_vocab_size)
        self.matchers = []

    def begin(self, rows: int) -> None:
        grammars = self.grammars if len(self.grammars) == rows else self.grammars[:1] * rows
        self.matchers = [self.xgr.GrammarMatcher(g) for g in grammars]  # xgrammar >= 0.2: rollback is unlimited
        self.bitmask = self.xgr.allocate_token_bitmask(1, self.size)

    def allowed(self, row: int):
        matcher = self.matchers[row]
        if matcher.is_terminated():
            return None
        matcher.fill_next_token_bitmask(self.bitmask, 0)
        return _unpack(self.bitmask[0], self.size)

    def accept(self, row: int, token: int) -> bool:
        matcher = self.matchers[row]
        return not matcher.is_terminated() and bool(matcher.accept_token(int(token)))

    def rollback(self, row: int, n: int) -> None:
        if n:
            self.matchers[row].rollback(n)

    def forced(self, row: int) -> list[int]:
        """The grammar's jump-forward string from here (xgrammar's ``find_jump_forward_string``: a JSON key and
        the punctuation around it), tokenized by longest match over the tokens the grammar allows, LESS its last
        token (it may merge with the free text that follows: ``' '`` + ``'true'`` is ``' true'``). Empty where
        the string takes fewer than two tokens."""
        matcher = self.matchers[row]
        if matcher.is_terminated():
            return []
        rest = matcher.find_jump_forward_string().encode()
        if not rest:
            return []
        lookup, longest = self._lookup()
        probe, out = matcher.fork(), []
        while rest:
            for n in range(min(len(rest), longest), 0, -1):
                token = lookup.get(rest[:n])
                if token is not None:
                    break
            else:
                break
            if not probe.accept_token(token):
                break
            out.append(token)
            rest = rest[n:]
        return out[:-1]

    def _lookup(self) -> tuple[dict[bytes, int], int]:
        """bytes -> the first token id spelling them, over the grammar's tokenizer (built once per compiled grammar,
        which callers reuse across calls; the entry keeps the grammar alive, so its id stays its own)."""
        grammar = self.grammars[0]
        key = id(grammar)
        if key not in _LOOKUPS:
            info = grammar.tokenizer_info
            table: dict[bytes, int] = {}
            special = set(info.special_token_ids)
            for i, spelled in enumerate(info.decoded_vocab):
                if spelled and i not in special:
                    table.setdefault(spelled, i)
            _LOOKUPS.clear()  # one tokenizer at a time (a table is ~10 MB for a 150k vocabulary)
            _LOOKUPS[key] = (table, max(map(len, table)), grammar)
        table, longest, _ = _LOOKUPS[key]
        return table, longest


class OutlinesCoreDraft:
    """Draft constraint from outlines' ``OutlinesCoreLogitsProcessor``: fresh guides on its index."""

    def __init__(self, processor):
        from outlines_core import Guide

        self.guide = Guide
        self.index = processor.index
        self.guides = []
        self.size = None

    def begin(self, rows: int) -> None:
        self.guides = [self.guide(self.index, max_rollback=MAX_ROLLBACK) for _ in range(rows)]

    def allowed(self, row: int):
        guide = self.guides[row]
        if guide.is_finished():
            return None
        return torch.tensor(guide.get_tokens(), dtype=torch.long)  # allowed ids (the engine makes the mask)

    def accept(self, row: int, token: int) -> bool:
        guide = self.guides[row]
        if not guide.accepts_tokens([int(token)]):
            return False
        guide.advance(token_id=int(token), return_tokens=False)
        return True

    def rollback(self, row: int, n: int) -> None:
        if n:
            self.guides[row].rollback_state(n)


class TrackedConstraint:
    """A draft constraint kept on each row's sequence: the tokens it holds per row, and rows it lost (a token it
    does not allow: the row drafts unconstrained from then on)."""

    def __init__(self, constraint, rows: int):
        constraint.begin(rows)
        self.constraint = constraint
        self.tokens: list[list[int]] = [[] for _ in range(rows)]
        self.off = [False] * rows
        self.stuck = [False] * rows  # a draft it did not allow this round: unconstrained until the next sync

    def allowed(self, row: int):
        return None if self.off[row] or self.stuck[row] else self.constraint.allowed(row)

    def forced(self, row: int) -> list[int]:
        """Tokens the row's grammar determines from here (the constraint's optional ``forced``), or []."""
        if self.off[row] or self.stuck[row] or not hasattr(self.constraint, "forced"):
            return []
        return self.constraint.forced(row)

    def draft(self, row: int, token: int) -> None:
        """A drafted token (tentative: ``sync`` takes back what verification drops)."""
        if self.off[row] or self.stuck[row]:
            return
        if self.constraint.accept(row, token):
            self.tokens[row].append(token)
        else:
            self.stuck[row] = True

    def sync(self, row: int, content: list[int]) -> None:
        """Bring the row to ``content`` (its generated tokens, then its undecided drafts): roll back to the
        common prefix, accept the rest."""
        if self.off[row]:
            return
        held = self.tokens[row]
        common, n = 0, min(len(held), len(content))
        while common < n and held[common] == content[common]:
            common += 1
        self.constraint.rollback(row, len(held) - common)
        del held[common:]
        self.stuck[row] = False
        for token in content[common:]:
            if not self.constraint.accept(row, token):
                self.off[row] = True
                return
            held.append(token)


def draft_constraint_for(processors) -> object | None:
    """A draft constraint for the call's processors: built when exactly one of them is a client we know
    (xgrammar's HF processor, outlines' outlines_core processor); None otherwise (drafts go unconstrained)."""
    found = []
    for proc in processors or []:
        cls = type(proc)
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name == "xgrammar.contrib.hf.LogitsProcessor":
            found.append(XgrammarDraft)
        elif name == "outlines.backends.outlines_core.OutlinesCoreLogitsProcessor":
            found.append(OutlinesCoreDraft)
        else:
            continue
        found[-1] = (found[-1], proc)
    if len(found) != 1:
        return None
    make, proc = found[0]
    return make(proc)
