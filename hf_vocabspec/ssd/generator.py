"""The SSD candidate generator: hands out cached drafts in HF's loop and pre-drafts the next round's tree.

- HF's verification loop stays HF's: ``get_candidates`` returns this round's drafts (a cached branch on a hit,
  the backup's on a miss) and ``update_candidate_strategy`` learns the outcome (j, t) = (num_matches,
  input_ids[0, -1]) that picks next round's branch (hf_vocabspec.ssd.outcomes, .cache).
- Tree drafting: all Q = (L+1) F branches advance in ONE drafter forward per depth step, packed in one
  sequence with explicit position ids and a FLOAT additive 4D mask (a bool mask is wrong under eager
  attention), then ``cache.crop`` drops the tree tokens: no cache copies, no cross-branch contamination. The
  drafter cache holds full-attention layers only, so the mask (with the sliding window written into it for
  sliding layers) sees the whole prefix of every branch, and crops are exact.
- Misses: ``backup="neural"`` drafts just in time (ordinary speculative decoding, exact); ``backup="none"``
  proposes nothing that round (the target's own token, exact). The first round is always a miss.
- The drafting API (:meth:`next_drafts`, :meth:`predraft`, :meth:`observe`) is what both the inline path
  (``mode="sync"``) and the worker process (hf_vocabspec.ssd.worker) drive.
"""

from __future__ import annotations

import time
import warnings

import torch
from transformers.cache_utils import DynamicCache

from ..generation import TrimmedCandidateGenerator
from ..modeling import TrimmedDrafter, cache_kwarg
from .cache import Branch, Drafts, SpeculationCache, full_log_q
from .config import SSDConfig, SSDStats, fix_draft_length
from .outcomes import Outcome, observe_outcome, predict_outcomes
from .fallback import should_fall_back
from .saguaro import sample_drafts


def tree_mask(prefix_len: torch.Tensor, positions: torch.Tensor, n_cache: int, step: int, q: int,
              window: int | None, dtype: torch.dtype) -> torch.Tensor:
    """Float additive mask (1, 1, Q, n_cache + step Q): branch b sees cache[:prefix_len[b]] and its own tree
    tokens (and, for a sliding layer, only keys within ``window`` of its position)."""
    keys = torch.arange(n_cache, device=positions.device)
    allowed_prefix = keys[None, :] < prefix_len[:, None]
    eye = torch.eye(q, dtype=torch.bool, device=positions.device)
    allowed = torch.cat([allowed_prefix, eye.repeat(1, step)], dim=1)
    if window is not None:
        tree_pos = [(positions - (step - 1 - i))[None, :].expand(q, -1) for i in range(step)]
        key_pos = torch.cat([keys[None, :].expand(q, -1), *tree_pos], dim=1)
        allowed &= key_pos > (positions[:, None] - window)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=positions.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


class SSDCandidateGenerator(TrimmedCandidateGenerator):
    """Synchronous SSD: tree pre-drafting inline after each round; also the worker process's engine."""

    def __init__(self, input_ids, assistant_model: TrimmedDrafter, generation_config, model_kwargs,
                 inputs_tensor=None, logits_processor=None, target_vocab_size=None,
                 ssd_config: SSDConfig | None = None):
        super().__init__(input_ids, assistant_model, generation_config, model_kwargs, inputs_tensor,
                         logits_processor, target_vocab_size)
        self.ssd_config = ssd_config or SSDConfig()
        fix_draft_length(self, self.ssd_config)
        self.cache = DynamicCache()  # full-attention layers only (see module docstring)
        body = self.drafter.model.config
        layer_types = getattr(body, "layer_types", None) or []
        self.window = getattr(body, "sliding_window", None) if "sliding_attention" in layer_types else None
        self.value_only = self.step.value_only
        self.stats = SSDStats(mode=self.ssd_config.mode)
        self.drafter.last_speculation_stats = self.stats
        self.speculation = SpeculationCache()
        self.outcome: Outcome | None = None
        self.active = True  # False after a fallback: ordinary drafting for the rest of the call
        self.returned_at: float | None = None  # when get_candidates returned (verify time starts)

    # --- the drafting API (inline path and worker) -----------------------------------------------------------
    def observe(self, outcome: Outcome | None, rounds: int) -> None:
        """Take the last round's outcome and the number of rounds verified so far (the worker mirrors the
        main process's generator with it)."""
        self.outcome = outcome
        self.stats.rounds = rounds

    @torch.no_grad()
    def next_drafts(self, input_ids: torch.LongTensor, max_new: int) -> Drafts | None:
        """This round's drafts (at most ``max_new``): the cached branch on a hit, else the backup's (None:
        backup "none" proposes nothing this round)."""
        self.vocab.update(input_ids)  # fixed for the whole round: every draft of it uses the same draft space
        looked, branch = self.speculation.lookup(self.outcome, input_ids.shape[1])
        self.stats.lookups += looked
        if branch is not None:
            self.stats.hits += 1
            return branch.head(max_new)
        if self.ssd_config.backup == "none" and self.stats.rounds > 0:
            return None
        return self._draft_inline(input_ids, max_new)

    @torch.no_grad()
    def predraft(self, input_ids: torch.LongTensor, drafts: Drafts | None) -> None:
        """Glue forward over the round's drafts, predict the outcomes, pre-draft every predicted branch."""
        t0 = time.perf_counter()
        self.speculation.fill({})
        n0 = input_ids.shape[1]
        n_drafts = 0 if drafts is None else drafts.tokens.numel()
        seq = input_ids[0] if drafts is None else torch.cat([input_ids[0], drafts.tokens])
        # glue: the cache holds the committed prefix and every draft; its last logits predict the depth-L bonus
        to_feed = self._sync_cache(seq[None])
        start = self.fed.numel()
        pos = torch.arange(start, start + to_feed.shape[1], device=seq.device)[None]
        out = self.drafter.model(input_ids=to_feed, position_ids=pos, use_cache=True,
                                     **{cache_kwarg(self.drafter.model): self.cache})
        self.fed = torch.cat([self.fed, to_feed[0]])
        n_cache = self.fed.numel()
        bonus_top = []
        if n_drafts == 0 or not bool(self._is_eos(drafts.tokens[-1:]).any()):
            logits = self._process([seq], self.vocab.logits(out.last_hidden_state[:, -1]).float())
            vals, top = logits.topk(min(self.ssd_config.fan_out, logits.shape[-1]), dim=-1)
            bonus_top = [int(i) for i, v in zip(top[0].tolist(), vals[0].tolist()) if v > float("-inf")]
        eos = set() if self.eos is None else set(self.eos.tolist())
        roots = predict_outcomes(None if drafts is None else drafts.tokens, None if drafts is None else drafts.top,
                                 bonus_top, self.vocab.ids, self.ssd_config.fan_out, eos, n0,
                                 self.main_model_max_length)
        roots_j = torch.tensor([j for j, _ in roots], dtype=torch.long, device=seq.device)
        roots_t = torch.tensor([t for _, t in roots], dtype=torch.long, device=seq.device)
        q = len(roots)
        room = int((self.main_model_max_length - (n0 + roots_j + 1) - 1).max()) if q else 0
        steps = min(self.num_assistant_tokens, room)
        if q == 0 or steps <= 0:
            self.stats.predraft_s += time.perf_counter() - t0
            return
        prefix_len = n0 + roots_j  # branch b sees committed + its accepted drafts, then its own tree tokens
        branch_seqs = [torch.cat([seq[: n0 + int(j)], t[None]]) for j, t in zip(roots_j, roots_t)]
        x = roots_t
        toks, laws, tops = [], [], []
        for s in range(1, steps + 1):
            positions = n0 + roots_j + (s - 1)
            mask = tree_mask(prefix_len, positions, n_cache, s, q, None, self.drafter.dtype)
            if self.window is not None:
                mask = {"full_attention": mask, "sliding_attention": tree_mask(prefix_len, positions, n_cache, s, q,
                                                                               self.window, self.drafter.dtype)}
            out = self.drafter.model(input_ids=x[None], position_ids=positions[None], attention_mask=mask,
                                     use_cache=True, **{cache_kwarg(self.drafter.model): self.cache})
            logits = self._process(branch_seqs, self.step.head(out.last_hidden_state[0]))
            idx, law, top = self._sample(logits)
            x = self._to_tokens(idx)
            toks.append(x)
            tops.append(top)
            if law is not None:
                laws.append(law)
            if not self.value_only:
                branch_seqs = [torch.cat([b, t[None]]) for b, t in zip(branch_seqs, x)]
        self.cache.crop(-(steps * q))
        toks_t = torch.stack(toks, dim=1)  # (Q, steps)
        tops_t = torch.stack(tops, dim=1)  # (Q, steps, F+1)
        laws_t = torch.stack(laws, dim=1) if laws else None  # (Q, steps, W)
        eos_hit = self._is_eos(toks_t)
        width = self.vocab.ids.numel()
        branches = {}
        for b, (j, t) in enumerate(roots):
            n = int(eos_hit[b].nonzero()[0]) + 1 if bool(eos_hit[b].any()) else steps
            branches[(j, t)] = Branch(toks_t[b, :n], None if laws_t is None else laws_t[b, :n], tops_t[b, :n],
                                      width, base_len=n0 + j + 1)
        self.speculation.fill(branches)
        self.stats.trees += 1
        self.stats.tree_branches += q
        self.stats.tree_steps += steps
        self.stats.predraft_s += time.perf_counter() - t0

    # --- sampling -------------------------------------------------------------------------------------------
    def _process(self, seqs: list[torch.Tensor], logits: torch.Tensor) -> torch.Tensor:
        """The draft step's processors (every tree branch is a continuation of the one original row 0)."""
        return self.step.process(logits, seqs, [0] * logits.shape[0])

    def _sample(self, logits: torch.Tensor):
        return sample_drafts(logits, do_sample=self.do_sample, fan_out=self.ssd_config.fan_out,
                             scale=self.ssd_config.saguaro_scale)

    def _to_tokens(self, idx: torch.Tensor) -> torch.Tensor:
        """Draft indices -> target ids through the draft step (RDK moves kept draws, as in ordinary drafting)."""
        return self.step.to_tokens(idx)

    def _is_eos(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.eos is None:
            return torch.zeros_like(tokens, dtype=torch.bool)
        return torch.isin(tokens, self.eos)

    # --- just-in-time drafting (first round, misses) ---------------------------------------------------------
    def _draft_inline(self, input_ids: torch.LongTensor, max_new: int) -> Drafts:
        t0 = time.perf_counter()
        to_feed = self._sync_cache(input_ids)
        seq = input_ids[0]
        tokens, laws, tops = [], [], []
        for _ in range(max_new):
            start = self.fed.numel()
            pos = torch.arange(start, start + to_feed.shape[1], device=seq.device)[None]
            logits = self._process([seq], self.step.logits(to_feed, self.cache, position_ids=pos))
            self.fed = torch.cat([self.fed, to_feed[0]])
            idx, law, top = self._sample(logits)
            token = self._to_tokens(idx)
            tokens.append(token)
            tops.append(top)
            if law is not None:
                laws.append(law)
            seq = torch.cat([seq, token])
            to_feed = token[None]
            self.stats.draft_steps += 1
            self.stats.inline_draft_steps += 1
            if bool(self._is_eos(token).any()):
                break
        self.stats.inline_draft_s += time.perf_counter() - t0
        return Drafts(torch.cat(tokens), torch.cat(laws) if laws else None, torch.cat(tops), self.vocab.ids.numel())

    # --- HF's contract ---------------------------------------------------------------------------------------
    def _candidates(self, input_ids: torch.LongTensor, drafts: Drafts | None):
        """(sequence + drafts, full-vocabulary log q or None) as HF wants them; q scattered once per round."""
        if drafts is None or drafts.tokens.numel() == 0:
            return input_ids, None
        seq = torch.cat([input_ids, drafts.tokens[None]], dim=1)
        if not self.do_sample:
            return seq, None
        return seq, full_log_q(drafts, self.vocab.ids, self.vocab.k, self.rdk, self.target_vocab_size)

    @torch.no_grad()
    def get_candidates(self, input_ids: torch.LongTensor, *args, **kwargs):
        if not self.active:
            return super().get_candidates(input_ids, *args, **kwargs)
        input_ids = input_ids.to(self.drafter.device)
        max_new = min(self.num_assistant_tokens, self.main_model_max_length - input_ids.shape[1] - 1)
        if max_new <= 0:
            return input_ids, None
        drafts = self.next_drafts(input_ids, max_new)
        result = self._candidates(input_ids, drafts)
        self.predraft(input_ids, drafts)
        self.returned_at = time.perf_counter()
        return result

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int):
        observe_outcome(self, input_ids, num_matches)
        super().update_candidate_strategy(input_ids, scores, num_matches)
        self._maybe_fall_back()

    def _maybe_fall_back(self) -> None:
        """Before ``probe_rounds``: fall back as soon as even perfect hits could not pay (inline, the tree's
        glue + L steps cost at least the L steps it saves); at ``probe_rounds``: with the measured hit rate."""
        cfg = self.ssd_config
        if not (self.active and cfg.fallback) or self.stats.rounds > cfg.probe_rounds:
            return
        best = 1.0 if self.stats.rounds < cfg.probe_rounds else None
        reason = should_fall_back(self.stats, self.num_assistant_tokens, cfg.backup, "sync", hit_rate=best)
        if reason is None:
            return
        self.active = False
        self.speculation.clear()
        self.stats.fell_back = True
        self.stats.fallback_reason = reason
        warnings.warn(f"hf_vocabspec: {reason}.", stacklevel=3)
