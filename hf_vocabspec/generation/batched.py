"""Speculative decoding for batch > 1 (and ``num_return_sequences`` > 1): hf_vocabspec's own verification loop.

transformers refuses assisted generation at batch > 1 (issue #32165). The hard part is the caches: every row
accepts its own number of drafts per round. "Batch Speculative Decoding Done Right" (arXiv 2510.22876) shows
that naive batching breaks output equivalence (ragged lengths, position ids, padding inside the cache). This loop
keeps every row RIGHT-ALIGNED (left-pad realignment): after each round the rows that accepted fewer drafts are
shifted right inside both KV caches, so all rows end at the same column, padding lives only on the left (masked),
and per-row position ids count only real tokens. Why not masked holes with per-row positions: a hole inside
the cache sits inside a sliding window (Gemma 3: 512) and the row would see fewer real tokens than the model
was trained with; with right-aligned rows a column distance IS a token distance, so windows stay exact. The
realignment is one copy of the shifted rows per round (grouped by shift, at most L+1 groups per layer); the
caches are plain full-length ``DynamicCache`` layers (window semantics come from the mask), so nothing is
rolled back inside a sliding layer. Common left padding is cropped, finished rows are compacted out of both
models' batches.

Invariants between rounds (``seq``: (B, T) tokens, right-aligned, ``pad[b]`` masked columns on the left):
the target cache holds columns [0, T-1) (all but the last token), the drafter cache holds [0, D) with D <= T-2.
A round: the drafter feeds seq[:, D:] then L-1 drafts (L forwards), the target verifies [last, d_1..d_L] in
one forward, each row accepts n_b drafts plus one token from the target (greedy: argmax; sampling: the standard
accept/resample test against the exact q each draft was drawn from), emission stops at the first EOS / the
token budget / a stopping criterion, and both caches are cut to the accepted prefix and realigned.

Context tokens: ONE draft vocabulary for the batch, the union of pruned ids in all rows' contexts (one head
matmul for the batch; any q is exact because verification corrects it).

Fallback: at large batch on a compute-bound target, a verify of (L+1) positions for B rows may cost more than
it earns. With ``batched_speculation="auto"`` (the drafter's generation_config), the loop times its first rounds
and one plain decode step (which produces tokens too, nothing is wasted), hands them to the round model
(:class:`hf_vocabspec.cost.RoundModel`), and decodes plainly when speculation does not pay; "on" / "off" force it. The decision is in the stats.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from ..cost import RoundModel
from ..drafter import TrimmedDrafter, cache_kwarg
from .stats import SpeculationStats
from .vocabulary import DraftVocabulary, draft_space_processors, is_value_only

from ..drafter import SPECULATION_MODES  # the one home of the valid values
# Rounds timed before the auto decision (the first round also pays the prefill, so it is not timed).
PROBE_ROUNDS = 3
# Plain decode steps timed for the decision (the fastest counts: the first calls of a new shape pay one-off costs,
# e.g. the verify head's kernel trials, which would bias the decision either way).
PROBE_PLAIN_STEPS = 2


@dataclass
class _Timed:
    """One timed speculative round: wall seconds, of which drafting, draft steps, rows, tokens emitted."""

    seconds: float
    draft_s: float
    draft_steps: int
    rows: int
    emitted: int


@dataclass
class _Round:
    """One round's outcome for the active rows."""

    accepted: torch.Tensor  # (B,) drafts accepted per row
    new_tokens: torch.Tensor  # (B,) the target's token after the accepted drafts


class _AlignedCache:
    """A full-length DynamicCache whose rows are right-aligned; realign/compact/crop operate on every layer."""

    def __init__(self):
        self.cache = DynamicCache()

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def _tensors(self):
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                yield layer

    def keep(self, keep: torch.Tensor, new_length: int) -> None:
        """Row b keeps its first ``keep[b]`` columns, shifted right so that every row ends at ``new_length``.

        In place: only the rows that shift are copied (grouped by shift), then every layer is narrowed to
        ``new_length`` (a view; the next forward's append allocates as it always does)."""
        shift = new_length - keep
        groups = [(int(s), (shift == s).nonzero().flatten()) for s in torch.unique(shift).tolist() if s > 0]
        for layer in self._tensors():
            for name in ("keys", "values"):
                t = getattr(layer, name)
                for s, rows in groups:
                    t[rows, :, s:new_length] = t[rows, :, : new_length - s]  # the gather copies before writing
                setattr(layer, name, t[:, :, :new_length])

    def repeat(self, n: int) -> None:
        """Each row becomes n consecutive rows (one encoded prompt serving n sequences)."""
        for layer in self._tensors():
            layer.keys = layer.keys.repeat_interleave(n, dim=0)
            layer.values = layer.values.repeat_interleave(n, dim=0)

    def select(self, rows: torch.Tensor) -> None:
        for layer in self._tensors():
            layer.keys = layer.keys[rows]
            layer.values = layer.values[rows]

    def crop_left(self, n: int) -> None:
        for layer in self._tensors():
            layer.keys = layer.keys[:, :, n:]
            layer.values = layer.values[:, :, n:]


class _Drafter:
    """What the loop needs from an assistant: a batched forward returning draft-space logits over ``ids``.

    A :class:`TrimmedDrafter` scores its kept rows plus the batch's context tokens; any other model with the
    target's vocabulary (an untrimmed drafter) scores its full head.
    """

    def __init__(self, assistant, use_context: bool):
        self.model = assistant
        self.trimmed = isinstance(assistant, TrimmedDrafter)
        if self.trimmed:
            self.vocab = DraftVocabulary(assistant, use_context, int(assistant.config.max_context_tokens))
        else:
            self.vocab = None
        self.cache = _AlignedCache()

    @property
    def ids(self) -> torch.Tensor | None:
        return self.vocab.ids if self.vocab is not None else None

    def add_context(self, tokens: torch.Tensor) -> None:
        if self.vocab is not None:
            self.vocab.add(tokens)

    def forward(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True)
        if self.trimmed:
            body = self.model.model
            out = body(**kwargs, **{cache_kwarg(body): self.cache.cache})
            return self.vocab.logits(out.last_hidden_state[:, -1]).float()
        out = self.model(**kwargs, logits_to_keep=1, **{cache_kwarg(self.model): self.cache.cache})
        return out.logits[:, -1].float()

    def to_target(self, idx: torch.Tensor) -> torch.Tensor:
        return self.vocab.ids[idx] if self.vocab is not None else idx

    def scatter(self, probs: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """(..., n_ids) draft probabilities -> (..., V) over the target vocabulary."""
        if self.vocab is None:
            return probs[..., :vocab_size] if probs.shape[-1] > vocab_size else probs
        out = probs.new_zeros((*probs.shape[:-1], vocab_size))
        out[..., self.vocab.ids] = probs
        return out


def _apply(processors, sequences: list[torch.Tensor] | torch.Tensor, scores: torch.Tensor, batched: bool,
           per_row: list[list] | None = None):
    """Processors on (B, V) scores; per row with each row's own sequence (and ``per_row[b]``, that row's view of
    the processors) unless every processor is value-only."""
    if not processors:
        return scores
    if batched:
        for proc in processors:
            scores = proc(sequences if isinstance(sequences, torch.Tensor) else None, scores)
        return scores
    rows = []
    for b, seq in enumerate(sequences):
        row = scores[b : b + 1]
        for proc in (per_row[b] if per_row is not None else processors):
            row = proc(seq[None], row)
        rows.append(row)
    return torch.cat(rows)


def _row_views(processors, batch_size: int) -> list[list]:
    """Each row's view of the processors: a processor holding a per-row tensor (HF's repetition penalty keeps each
    row's padding length in ``prompt_ignore_length``) is copied with that tensor cut to the row."""
    views = []
    for b in range(batch_size):
        row = []
        for proc in processors:
            sliced = {k: v[b : b + 1] for k, v in vars(proc).items()
                      if isinstance(v, torch.Tensor) and v.dim() == 1 and v.shape[0] == batch_size and batch_size > 1}
            if sliced:
                proc = copy.copy(proc)
                vars(proc).update(sliced)
            row.append(proc)
        views.append(row)
    return views


class BatchedSpeculation:
    """One batched speculative ``generate`` call; ``run()`` returns the sequences (B, P + new) like HF."""

    def __init__(self, target, assistant, input_ids, logits_processor, stopping_criteria, generation_config,
                 attention_mask: torch.Tensor | None, num_draft_tokens: int, speculation: str = "auto"):
        if speculation not in SPECULATION_MODES:
            raise ValueError(f"batched_speculation must be one of {SPECULATION_MODES}, got {speculation!r}: set "
                             "drafter.generation_config.batched_speculation to one of them.")
        self.target = target
        self.config = generation_config
        self.device = input_ids.device
        self.prompt = input_ids
        B, P = input_ids.shape
        self.B = B
        self.do_sample = bool(generation_config.do_sample)
        self.L = int(num_draft_tokens)
        self.speculation = speculation
        self.vocab_size = target.config.get_text_config().vocab_size
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        self.pad_id = generation_config._pad_token_tensor
        eos = generation_config._eos_token_tensor
        self.eos = eos.flatten().to(self.device) if eos is not None else None
        if self.pad_id is None:
            self.pad_id = self.eos[0] if self.eos is not None else torch.tensor(0, device=self.device)
        self.max_new = int(generation_config.max_length) - P
        self.processors = list(logits_processor or [])
        self.value_only = all(is_value_only(p) for p in self.processors)
        self.row_processors = None if self.value_only else _row_views(self.processors, B)
        self.stopping = [c for c in (stopping_criteria or []) if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))]
        self.drafter = _Drafter(assistant, bool(getattr(assistant, "use_context_tokens", False)))
        self.draft_processors = (draft_space_processors(self.processors, self.drafter.vocab)
                                 if self.drafter.vocab is not None else self.processors)
        # Loop state (active rows only). seq is right-aligned; pad[b] masked columns on the left.
        self.seq = input_ids.clone()
        self.pad = (P - mask.sum(dim=1)).long()
        self.rows = torch.arange(B, device=self.device)  # original row of each active row
        self.generated: list[list[int]] = [[] for _ in range(B)]
        self.emitted: list[int] = []  # tokens emitted since the drafter's context tokens were last updated
        if self.drafter.vocab is not None:  # the prompts' own tokens (padding excluded)
            self.drafter.add_context(input_ids[mask.bool()])
        self.drafted_len = 0  # columns of seq the drafter cache holds
        self.stats = SpeculationStats(batch_size=B)
        self.round_times: list[_Timed] = []

    # ---- helpers -------------------------------------------------------------------------------------------
    def _mask(self, length: int) -> torch.Tensor:
        cols = torch.arange(length, device=self.device)
        return (cols[None, :] >= self.pad[:, None]).long()

    def _positions(self, start: int, n: int) -> torch.Tensor:
        cols = torch.arange(start, start + n, device=self.device)
        return (cols[None, :] - self.pad[:, None]).clamp(min=0)

    def _row_sequences(self) -> list[torch.Tensor]:
        """Each active row as target-only decoding would see it: its (padded) prompt + what it generated."""
        out = []
        for b in self.rows.tolist():
            gen = torch.tensor(self.generated[b], dtype=torch.long, device=self.device)
            out.append(torch.cat([self.prompt[b], gen]))
        return out

    def _target_forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens`` (B, n) after the target cache; logits (B, n, V) float32."""
        cache = self.target_cache
        start = cache.length
        n = tokens.shape[1]
        out = self.target(input_ids=tokens, attention_mask=self._mask(start + n), position_ids=self._positions(start, n),
                          use_cache=True, logits_to_keep=n, **{cache_kwarg(self.target): cache.cache})
        return out.logits[:, -n:].float()

    def _process_target(self, logits: torch.Tensor, drafts: torch.Tensor | None) -> torch.Tensor:
        """The target's processors at every verified position, each row seeing its own sequence up to there."""
        if not self.processors:
            return logits
        B, n, V = logits.shape
        if self.value_only:
            return _apply(self.processors, None, logits.reshape(B * n, V), batched=True).reshape(B, n, V)
        rows = self._row_sequences()
        out = torch.empty_like(logits)
        for i in range(n):
            seqs = rows if i == 0 else [torch.cat([r, drafts[b, :i]]) for b, r in enumerate(rows)]
            views = [self.row_processors[b] for b in self.rows.tolist()]
            out[:, i] = _apply(self.processors, seqs, logits[:, i], batched=False, per_row=views)
        return out

    # ---- one round ---------------------------------------------------------------------------------------
    def _draft(self, L: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """L drafts per row: (draft indices (B, L), draft probabilities (B, L, n_ids) or None, target ids (B, L))."""
        drafter = self.drafter
        T = self.seq.shape[1]
        to_feed = self.seq[:, self.drafted_len :]
        idxs, probs, tokens = [], [], []
        context = self.seq
        for step in range(L):
            start = drafter.cache.length
            n = to_feed.shape[1]
            logits = drafter.forward(to_feed, self._mask(start + n), self._positions(start, n))
            if self.draft_processors:
                if self.value_only:  # the draft-space list mirrors the target's, value-only ones unchanged
                    logits = _apply(self.draft_processors, context, logits, batched=True)
                else:
                    logits = _apply(self.draft_processors, list(context), logits, batched=False)
            if self.do_sample:
                p = logits.softmax(dim=-1)
                idx = torch.multinomial(p, 1)
                probs.append(p)
            else:
                idx = logits.argmax(dim=-1, keepdim=True)
            token = drafter.to_target(idx)
            idxs.append(idx)
            tokens.append(token)
            context = torch.cat([context, token], dim=1)
            to_feed = token
            self.stats.draft_steps += 1
        self.drafted_len = T + L - 1
        idx = torch.cat(idxs, dim=1)
        if drafter.vocab is not None and drafter.vocab.num_context:
            self.stats.context_proposed += int((idx >= drafter.vocab.k).sum())
        return idx, (torch.stack(probs, dim=1) if probs else None), torch.cat(tokens, dim=1)

    def _verify(self, idx, q, drafts, p_logits) -> _Round:
        """Accepted drafts per row and the target's next token (exact for greedy and sampling)."""
        B, L = drafts.shape
        if not self.do_sample:
            best = p_logits.argmax(dim=-1)  # (B, L+1)
            match = (best[:, :L] == drafts).long()
            accepted = match.cumprod(dim=1).sum(dim=1)
            return _Round(accepted, best.gather(1, accepted[:, None])[:, 0])
        p = p_logits.softmax(dim=-1)  # (B, L+1, V)
        p_draft = p[:, :L].gather(2, drafts[..., None])[..., 0]  # p(d_i)
        q_draft = q.gather(2, idx[..., None])[..., 0]  # q(d_i) > 0: d_i was drawn from q
        u = torch.rand_like(p_draft)
        ok = (u * q_draft <= p_draft).long()  # u <= p/q, without dividing
        accepted = ok.cumprod(dim=1).sum(dim=1)
        rows = torch.arange(B, device=self.device)
        p_next = p[rows, accepted]  # (B, V) at the first rejected (or bonus) position
        rejected = accepted < L
        if bool(rejected.any()):
            at = accepted.clamp(max=L - 1)
            q_full = self.drafter.scatter(q[rows, at], p.shape[-1])
            residual = (p_next - q_full).clamp(min=0)
            total = residual.sum(dim=-1, keepdim=True)
            # total == 0 only when p == q at that position, where rejection has probability 0
            residual = torch.where(total > 0, residual / total.clamp(min=1e-30), p_next)
            p_next = torch.where(rejected[:, None], residual, p_next)
        new = torch.multinomial(p_next, 1)[:, 0]
        return _Round(accepted, new)

    def _take_context(self) -> None:
        """Pruned ids among the tokens emitted since the last round join the batch's context tokens."""
        if self.emitted and self.drafter.vocab is not None:
            self.drafter.add_context(torch.tensor(self.emitted, dtype=torch.long, device=self.device))
        self.emitted = []

    def _emit(self, drafts: torch.Tensor | None, result: _Round) -> torch.Tensor:
        """Append each row's accepted drafts + new token (cut at EOS / budget / stopping criteria).

        Returns a (B,) bool tensor of rows that finished."""
        acc = result.accepted.tolist()
        new = result.new_tokens.tolist()
        draft_rows = drafts.tolist() if drafts is not None else None
        eos = set(self.eos.tolist()) if self.eos is not None else set()
        finished = []
        for i, b in enumerate(self.rows.tolist()):
            out = self.generated[b]
            tokens = (draft_rows[i][: acc[i]] if draft_rows is not None else []) + [new[i]]
            done = False
            for t in tokens:
                out.append(t)
                self.emitted.append(t)
                if t in eos or len(out) >= self.max_new or self._stop(b):
                    done = True
                    break
            finished.append(done)
        return torch.tensor(finished, device=self.device)

    def _stop(self, b: int) -> bool:
        if not self.stopping:
            return False
        gen = torch.tensor(self.generated[b], dtype=torch.long, device=self.device)
        seq = torch.cat([self.prompt[b], gen])[None]
        return any(bool(c(seq, None).any()) for c in self.stopping)

    def _advance(self, result: _Round, drafts: torch.Tensor | None, finished: torch.Tensor) -> None:
        """Cut both caches to the accepted prefix, realign the rows, compact finished rows out."""
        start = time.perf_counter()
        T = self.seq.shape[1]
        L = drafts.shape[1] if drafts is not None else 0
        n = result.accepted
        # tail[b] = the row's accepted drafts, then the target's new token at index n[b]
        tail = result.new_tokens[:, None] if drafts is None else torch.cat([drafts, drafts[:, :1]], dim=1).scatter(
            1, n[:, None], result.new_tokens[:, None])
        keep_rows = (~finished).nonzero().flatten()
        if keep_rows.numel() < self.rows.numel():
            self.rows, self.pad, n, tail = self.rows[keep_rows], self.pad[keep_rows], n[keep_rows], tail[keep_rows]
            self.seq = self.seq[keep_rows]
            self.target_cache.select(keep_rows)
            self.drafter.cache.select(keep_rows)
        if self.rows.numel() == 0:
            self.stats.realign_seconds += time.perf_counter() - start
            return
        m = int(n.max())
        shift = m - n
        # seq: row b gets its accepted drafts and the new token, right-aligned at T + m + 1
        new_seq = self.seq.new_full((self.seq.shape[0], T + m + 1), int(self.pad_id))
        for s in torch.unique(shift).tolist():
            rows = (shift == s).nonzero().flatten()
            c = m - s  # accepted drafts of these rows
            new_seq[rows, s : s + T] = self.seq[rows]
            new_seq[rows, s + T : s + T + c] = tail[rows, :c]
            new_seq[rows, -1] = tail[rows, c]
        self.seq = new_seq
        self.pad = self.pad + shift
        # target: [0, T-1) old + [last, d_1..d_n] valid -> T + n columns, aligned at T + m
        self.target_cache.keep(T + n, T + m)
        # drafter: keeps what it fed of the accepted prefix, at most all but the last two tokens
        if L:  # drafter: all but the last two tokens of each row; it fed the drafts up to d_{L-1}
            self.drafter.cache.keep(T + n - 1, T + m - 1)
            self.drafted_len = T + m - 1
        # (a plain decode step: the drafter fed nothing, every row grew by one token, no shift)
        # crop the padding every row shares
        common = int(self.pad.min())
        if common:
            self.seq = self.seq[:, common:]
            self.pad = self.pad - common
            self.target_cache.crop_left(common)
            self.drafter.cache.crop_left(min(common, self.drafted_len))
            self.drafted_len = max(self.drafted_len - common, 0)
        self.stats.realign_seconds += time.perf_counter() - start

    def _remaining(self) -> int:
        return max(self.max_new - len(self.generated[b]) for b in self.rows.tolist())

    def _speculative_round(self) -> int:
        L = min(self.L, self._remaining() - 1)
        if L < 1:  # one token left: a plain step is the whole job
            return self._plain_step()
        start = time.perf_counter()
        self._take_context()
        idx, q, drafts = self._draft(L)
        t_draft = time.perf_counter()
        logits = self._target_forward(torch.cat([self.seq[:, -1:], drafts], dim=1))
        logits = self._process_target(logits, drafts)
        result = self._verify(idx, q, drafts, logits)
        t_verify = time.perf_counter()
        self.stats.draft_seconds += t_draft - start
        self.stats.verify_seconds += t_verify - t_draft
        before = sum(len(self.generated[b]) for b in self.rows.tolist())
        rows_before = self.rows.numel()
        finished = self._emit(drafts, result)
        emitted = sum(len(self.generated[b]) for b in self.rows.tolist()) - before
        self.stats.rounds += 1
        self.stats.row_rounds += rows_before
        self.stats.proposed += rows_before * L
        self.stats.accepted += int(result.accepted.sum())
        self.stats.per_round_accepted.extend(result.accepted.tolist())
        self.stats.per_round_proposed.extend([L] * rows_before)
        self._advance(result, drafts, finished)
        return emitted

    def _plain_step(self) -> int:
        """One target-only decode step for every active row (exact: argmax or a draw from p)."""
        start = time.perf_counter()
        logits = self._target_forward(self.seq[:, -1:])
        logits = self._process_target(logits, None)[:, 0]
        new = torch.multinomial(logits.softmax(-1), 1)[:, 0] if self.do_sample else logits.argmax(-1)
        self.stats.verify_seconds += time.perf_counter() - start
        self.stats.plain_steps += 1
        result = _Round(torch.zeros_like(new), new)
        before = sum(len(self.generated[b]) for b in self.rows.tolist())
        finished = self._emit(None, result)
        emitted = sum(len(self.generated[b]) for b in self.rows.tolist()) - before
        self._advance(result, None, finished)
        return emitted

    # ---- the loop ----------------------------------------------------------------------------------------
    def _prefill(self, P: int) -> None:
        """Encode the prompts: everything but the last token (target) / the last two (drafter). With
        ``num_return_sequences`` = n, transformers has repeated each prompt n times: each prompt is encoded once
        and the caches are repeated."""
        n = int(getattr(self.config, "num_return_sequences", 1) or 1)
        if n > 1 and self.B % n == 0 and bool((self.seq.view(-1, n, P) == self.seq[::n, None]).all()):
            unique = torch.arange(0, self.B, n, device=self.device)
        else:
            n, unique = 1, None
        seq, pad = self.seq, self.pad
        if unique is not None:  # run the prefill on one copy of each prompt
            self.seq, self.pad = seq[unique], pad[unique]
        if P > 1:
            self._target_forward(self.seq[:, :-1])
        if self.speculation != "off" and P > 2:
            self.drafter.forward(self.seq[:, :-2], self._mask(P - 2), self._positions(0, P - 2))
            self.drafted_len = P - 2
        if unique is not None:
            self.seq, self.pad = seq, pad
            self.target_cache.repeat(n)
            self.drafter.cache.repeat(n)

    @torch.no_grad()
    def run(self) -> torch.Tensor:
        self.target_cache = _AlignedCache()
        P = self.seq.shape[1]
        self._prefill(P)
        mode = "decode" if self.speculation == "off" else "speculate"
        self.stats.decision = {"on": "speculate (forced: batched_speculation='on')",
                               "off": "decode (forced: batched_speculation='off')", "auto": ""}[self.speculation]
        rounds = 0
        plain_probes: list[tuple[float, int]] = []  # (seconds, rows) of the probe's plain steps
        while self.rows.numel():
            t0 = time.perf_counter()
            rows = self.rows.numel()
            if mode == "speculate":
                draft_before, steps_before = self.stats.draft_seconds, self.stats.draft_steps
                emitted = self._speculative_round()
                rounds += 1
                steps = self.stats.draft_steps - steps_before
                if rounds > 1 and steps:  # the first round pays for warm-up: not timed
                    self.round_times.append(_Timed(time.perf_counter() - t0, self.stats.draft_seconds - draft_before,
                                                   steps, rows, emitted))
            else:
                self._plain_step()
                if not self.stats.decision:
                    plain_probes.append((time.perf_counter() - t0, rows))
            if self.speculation == "auto" and not self.stats.decision and len(self.round_times) >= PROBE_ROUNDS:
                if len(plain_probes) < PROBE_PLAIN_STEPS:
                    mode = "decode"  # probe plain steps (they produce tokens: nothing is wasted)
                    continue
                mode = self._decide(*min(plain_probes))
        if not self.stats.decision:
            self.stats.decision = "speculate (finished before the measured decision)"
        return self._sequences()

    def _decide(self, plain_step_s: float, plain_rows: int) -> str:
        """Speculate on only if the round model, fed this call's measured rounds and plain step, says it pays."""
        rounds = self.round_times
        rows = statistics.median(r.rows for r in rounds)
        model = RoundModel.from_measured(
            draft_step_s=min(r.draft_s / r.draft_steps for r in rounds),  # fastest: one-off costs excluded
            verify_step_s=min(r.seconds - r.draft_s for r in rounds),  # verify + bookkeeping
            decode_step_s=plain_step_s, batch_size=plain_rows)
        tau = sum(r.emitted for r in rounds) / sum(r.rows for r in rounds)
        L = statistics.median(r.draft_steps for r in rounds)
        # the plain step ran with plain_rows rows; rounds with about the same: compare at one batch size
        reason = model.fallback_reason(L, batch_size=plain_rows, tau=tau)
        if reason is None:
            speedup = model.speedup(L, batch_size=plain_rows, tau=tau)
            self.stats.decision = f"speculate (measured: predicted {speedup:.2f}x plain decoding at batch {rows:g})"
            return "speculate"
        self.stats.decision = f"decode ({reason})"
        return "decode"

    def _sequences(self) -> torch.Tensor:
        n = max((len(g) for g in self.generated), default=0)
        out = torch.full((self.B, n), int(self.pad_id), dtype=torch.long, device=self.device)
        for b, g in enumerate(self.generated):
            if g:
                out[b, : len(g)] = torch.tensor(g, dtype=torch.long, device=self.device)
        return torch.cat([self.prompt, out], dim=1)
