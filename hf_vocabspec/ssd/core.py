"""SSD, speculative speculative decoding (Kumar et al., 2026), inside ``target.generate(assistant_model=...)``.

While the target verifies round r, the drafter predicts the likely verification outcomes (accepted length j
and bonus/correction token t) and pre-drafts round r+1 for each of them; when the real outcome is one of
the predicted ones (a *hit*) round r+1 starts with its drafts ready and the draft latency is hidden.

    from hf_vocabspec.ssd import SSDConfig
    with drafter.with_ssd(SSDConfig(fan_out=3, saguaro_scale=0.5)) as ssd:
        out = target.generate(**inputs, assistant_model=ssd)

Design (why it looks like this):
- HF's verification loop stays HF's. :class:`SSDCandidateGenerator` hands out cached drafts in
  ``get_candidates`` and learns (j, t) = (num_matches, input_ids[0, -1]) in ``update_candidate_strategy``.
  The speculation cache is keyed by (j, t) only: picking a branch by its KEY is unbiased, picking or
  cutting one by its CONTENT would not be (branches are cut only at EOS and at max length).
- Outcome prediction with a fan-out budget F: at depth j < L the correction token is drawn from
  norm(max(p - q, 0)), whose mass on the drafted token is zero (a rejected draft has p < q), so the top-F
  OTHER tokens of the draft distribution are predicted; at depth L (all accepted) the bonus comes from p,
  predicted by the top-F of the drafter's next distribution. (Under greedy the same rule holds: the
  correction is the target argmax, never the drafted token.)
- Tree drafting: all Q = (L+1) F branches advance in ONE drafter forward per depth step, packed in one
  sequence with explicit position ids and a FLOAT additive 4D mask (a bool mask is wrong under eager
  attention), then ``cache.crop`` drops the tree tokens: no cache copies, no cross-branch contamination.
  The drafter cache holds full-attention layers only, so the mask (with the sliding window written into
  it for sliding layers) sees the whole prefix of every branch, and crops are exact.
- Saguaro sampling: q_C = normalise(q with its top-(F+1) probabilities scaled by C). With C < 1 the
  residual max(p - q_C, 0) concentrates on the top tokens, i.e. on the cached branches. Drafts are sampled
  from q_C and q_C is what the verifier gets, so HF's ``_speculative_sampling`` stays exact for any C.
  Every cached draft carries the law it was drawn from (its branch's own q_C given its prefix).
- Misses: ``backup="neural"`` drafts just in time (ordinary speculative decoding, exact); ``backup="none"``
  proposes nothing that round (the target's own token, exact). The first round is always a miss.
- Fallback: after ``probe_rounds`` rounds the measured step costs decide whether SSD pays
  (:func:`should_fall_back`); when it does not, the generator drafts like ordinary speculative decoding
  for the rest of the call and says so (``stats.fell_back``, ``stats.fallback_reason`` and a warning).
- Where the drafter runs: ``mode="sync"`` builds the tree inline (exact, measures hit rate and tree cost,
  never faster than ordinary SD on the same compute); ``mode="worker"`` runs the drafter in its own
  spawned process with its own torch threads (see hf_vocabspec/ssd/worker.py), overlapping the tree with
  the target's verification.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache

from ..cost import expected_accepted_length
from ..drafter import TrimmedDrafter
from ..generation import _VALUE_ONLY, SpeculationStats, TrimmedCandidateGenerator

_BACKUPS = ("neural", "none")
_MODES = ("sync", "worker")


@dataclass
class SSDConfig:
    """Settings of one SSD session.

    fan_out: predicted outcomes per depth (F); ``saguaro_scale``: C in (0, 1] (1 = plain sampling from q);
    ``backup``: what a miss does ("neural": just-in-time drafting; "none": no draft that round);
    ``num_assistant_tokens``: L (None = the drafter's generation_config); ``mode``: "sync" or "worker";
    ``device``/``draft_threads``: where the worker's drafter runs and its torch threads;
    ``fallback``: switch to ordinary drafting when the measured costs say SSD cannot pay, decided after
    ``probe_rounds`` rounds; ``worker_timeout_s``: longest wait for a worker reply before it is declared dead.
    """

    fan_out: int = 3
    saguaro_scale: float = 1.0
    backup: str = "neural"
    num_assistant_tokens: int | None = None
    mode: str = "sync"
    device: str | None = None
    draft_threads: int = 1
    fallback: bool = True
    probe_rounds: int = 8
    worker_timeout_s: float = 120.0

    def __post_init__(self):
        if isinstance(self.fan_out, bool) or not isinstance(self.fan_out, int) or self.fan_out < 1:
            raise ValueError(f"SSDConfig.fan_out must be an integer >= 1 (outcomes predicted per depth); got {self.fan_out!r}.")
        c = self.saguaro_scale
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or not 0 < c <= 1:
            raise ValueError(f"SSDConfig.saguaro_scale must be in (0, 1] (1 = plain sampling); got {c!r}.")
        if self.backup not in _BACKUPS:
            raise ValueError(f"SSDConfig.backup must be one of {_BACKUPS}; got {self.backup!r}.")
        n = self.num_assistant_tokens
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"SSDConfig.num_assistant_tokens must be None or an integer >= 1; got {n!r}.")
        if self.mode not in _MODES:
            raise ValueError(f"SSDConfig.mode must be one of {_MODES}; got {self.mode!r}.")
        if isinstance(self.draft_threads, bool) or not isinstance(self.draft_threads, int) or self.draft_threads < 1:
            raise ValueError(f"SSDConfig.draft_threads must be an integer >= 1; got {self.draft_threads!r}.")
        if isinstance(self.probe_rounds, bool) or not isinstance(self.probe_rounds, int) or self.probe_rounds < 1:
            raise ValueError(f"SSDConfig.probe_rounds must be an integer >= 1; got {self.probe_rounds!r}.")
        if not self.worker_timeout_s > 0:
            raise ValueError(f"SSDConfig.worker_timeout_s must be > 0 seconds; got {self.worker_timeout_s!r}.")


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

    def add(self, other: SpeculationStats) -> SSDStats:
        """Accumulate another call's counters (SSD fields too, when ``other`` is an SSDStats)."""
        super().add(other)
        if isinstance(other, SSDStats):
            for name in ("lookups", "hits", "trees", "tree_branches", "tree_steps", "inline_draft_s",
                         "inline_draft_steps", "predraft_s", "verify_s", "wait_s"):
                setattr(self, name, getattr(self, name) + getattr(other, name))
            self.mode = other.mode
            if other.fell_back:
                self.fell_back, self.fallback_reason = True, other.fallback_reason
        return self

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


# --- cost model (documented, used by the fallback and by the bench's projected column) ------------------------
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
    if compute not in ("sync", "dedicated"):
        raise ValueError(f"compute must be 'sync' or 'dedicated'; got {compute!r}.")
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


def project_from_stats(stats: SSDStats, num_draft_tokens: int, backup: str = "neural",
                       tau_sd: float | None = None, acceptance: float | None = None) -> SSDProjection:
    """:func:`project_speedup` from one run's SSDStats (tau_SD from ``tau_sd``, or from a per-token
    ``acceptance`` via E(a), or, lacking both, the SSD run's own tau)."""
    tau_ssd = stats.mean_accepted_length
    if tau_sd is None:
        tau_sd = expected_accepted_length(acceptance, num_draft_tokens) if acceptance is not None else tau_ssd
    return project_speedup(hit_rate=stats.hit_rate, draft_step_s=stats.draft_step_s,
                           verify_step_s=stats.verify_step_s, tree_s=stats.tree_s,
                           num_draft_tokens=num_draft_tokens, tau_sd=tau_sd, tau_ssd=tau_ssd,
                           backup=backup, compute="dedicated")


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


# --- the drafted rounds ----------------------------------------------------------------------------------------
@dataclass
class _Drafts:
    """One round's drafts: target ids, the law each was drawn from (draft space, width W), prediction tops."""

    tokens: torch.Tensor  # (n,) target ids
    law: torch.Tensor | None  # (n, W) float32 probabilities (sampling only)
    top: torch.Tensor  # (n, F+1) draft indices of the largest UNSCALED q, -1 where q is zero
    width: int  # W: draft-space width (K + context tokens) when drawn


@dataclass
class _Branch(_Drafts):
    base_len: int = 0  # sequence length (committed + accepted + bonus) this branch continues


def full_log_q(drafts: _Drafts, ids: torch.Tensor, k: int, rdk, vocab_size: int) -> torch.Tensor:
    """(1, n, V) log of the law the drafts were drawn from, over the target vocabulary (once per round).

    ``ids`` maps draft indices to target ids (append-only, so an older, narrower law maps with its prefix);
    with an RDK kernel the kept part is redistributed exactly (q_RDK = M^T q'), as in generation.py.
    """
    law = drafts.law[None]  # (1, n, W)
    ids = ids[: drafts.width]
    if rdk is not None:
        full = rdk.redistribute(law[..., :k])
        if drafts.width > k:
            full.index_add_(-1, ids[k:], law[..., k:])
    else:
        full = law.new_zeros((*law.shape[:-1], vocab_size))
        full[..., ids] = law
    return full.log()


def record_outcome(gen, input_ids: torch.LongTensor, num_matches: int) -> None:
    """A round's verification outcome (accepted length, bonus token, sequence length) and the time the target
    took since ``get_candidates`` returned; shared by the inline and the worker generators."""
    if gen._t_returned is not None:
        gen.stats.verify_s += time.perf_counter() - gen._t_returned
        gen._t_returned = None
    gen.outcome = (int(num_matches), int(input_ids[0, -1]), input_ids.shape[1])


class SSDCandidateGenerator(TrimmedCandidateGenerator):
    """Synchronous SSD: tree pre-drafting inline after each round; also the worker process's engine."""

    def __init__(self, input_ids, assistant_model: TrimmedDrafter, generation_config, model_kwargs,
                 inputs_tensor=None, logits_processor=None, target_vocab_size=None,
                 ssd_config: SSDConfig | None = None):
        super().__init__(input_ids, assistant_model, generation_config, model_kwargs, inputs_tensor,
                         logits_processor, target_vocab_size)
        cfg = ssd_config or SSDConfig()
        self.ssd_config = cfg
        if cfg.num_assistant_tokens is not None:
            self.num_assistant_tokens = cfg.num_assistant_tokens
        self.num_assistant_tokens = int(self.num_assistant_tokens)
        self.assistant_generation_config.num_assistant_tokens_schedule = "constant"  # L fixed: tree depth
        self.assistant_confidence_threshold = 0.0  # cut only at EOS / max length
        self.cache = DynamicCache()  # full-attention layers only (see module docstring)
        body = self.drafter.model.config
        layer_types = getattr(body, "layer_types", None) or []
        self.window = getattr(body, "sliding_window", None) if "sliding_attention" in layer_types else None
        self.value_only = all(isinstance(p, _VALUE_ONLY) for p in self.draft_processors)
        self.stats = SSDStats(mode=cfg.mode)
        self.drafter.last_speculation_stats = self.stats
        self.branches: dict[tuple[int, int], _Branch] = {}
        self.tree_ready = False
        self.outcome: tuple[int, int, int] | None = None  # (accepted j, bonus token, new length)
        self.active = True
        self._t_returned: float | None = None

    # --- sampling -------------------------------------------------------------------------------------------
    def _process(self, seqs: list[torch.Tensor], logits: torch.Tensor) -> torch.Tensor:
        """Apply the draft-space processors row by row (batched when they only read logit values)."""
        if self.value_only:
            for proc in self.draft_processors:
                logits = proc(seqs[0][None], logits)
            return logits
        rows = []
        for i, seq in enumerate(seqs):
            row = logits[i : i + 1]
            for proc in self.draft_processors:
                row = proc(seq[None], row)
            rows.append(row)
        return torch.cat(rows)

    def _sample(self, logits: torch.Tensor, saguaro: bool = True):
        """(R, W) processed logits -> (draft idx (R,), law (R, W) | None, top (R, F+1))."""
        k = min(self.ssd_config.fan_out + 1, logits.shape[-1])
        if not self.do_sample:
            vals, top = logits.topk(k, dim=-1)
            return logits.argmax(dim=-1), None, top.masked_fill(vals == float("-inf"), -1)
        probs = logits.softmax(dim=-1)
        vals, top = probs.topk(k, dim=-1)
        law = probs
        c = self.ssd_config.saguaro_scale
        if saguaro and c != 1:
            law = probs.scatter(1, top, vals * c)
            law = law / law.sum(dim=-1, keepdim=True)
        idx = torch.multinomial(law, num_samples=1)[:, 0]
        return idx, law, top.masked_fill(vals <= 0, -1)

    def _to_tokens(self, idx: torch.Tensor) -> torch.Tensor:
        """Draft indices -> target ids (RDK moves kept draws to a neighbour, exactly as in generation.py)."""
        tokens = self.vocab.ids[idx]
        if self.vocab.num_context:  # (a device sync: skipped when there is nothing to count)
            self.stats.context_proposed += int((idx >= self.vocab.k).sum())
        if self.rdk is not None:
            kept = idx < self.vocab.k
            if bool(kept.any()):
                moved = self.rdk.sample(idx.clamp_max(self.vocab.k - 1))
                tokens = torch.where(kept, moved, tokens)
                self.stats.pruned_proposed += int((tokens != self.vocab.ids[idx]).sum())
        return tokens

    def _is_eos(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.eos is None:
            return torch.zeros_like(tokens, dtype=torch.bool)
        return torch.isin(tokens, self.eos)

    # --- just-in-time drafting (first round, misses, fallback) -----------------------------------------------
    def _draft_inline(self, input_ids: torch.LongTensor, max_new: int, saguaro: bool = True) -> _Drafts:
        t0 = time.perf_counter()
        to_feed = self._sync_cache(input_ids)
        seq = input_ids[0]
        tokens, laws, tops = [], [], []
        for _ in range(max_new):
            start = self.fed.numel()
            pos = torch.arange(start, start + to_feed.shape[1], device=seq.device)[None]
            out = self.drafter.model(input_ids=to_feed, position_ids=pos, past_key_values=self.cache, use_cache=True)
            self.fed = torch.cat([self.fed, to_feed[0]])
            logits = self._process([seq], self.vocab.logits(out.last_hidden_state[:, -1]).float())
            idx, law, top = self._sample(logits, saguaro)
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
        return _Drafts(torch.cat(tokens), torch.cat(laws) if laws else None, torch.cat(tops), self.vocab.ids.numel())

    # --- the speculation tree --------------------------------------------------------------------------------
    def _tree_mask(self, prefix_len: torch.Tensor, positions: torch.Tensor, n_cache: int, step: int,
                   q: int, window: int | None) -> torch.Tensor:
        """Float additive mask (Q, n_cache + step Q): branch b sees cache[:prefix_len[b]] and its own tree tokens."""
        dtype = self.drafter.dtype
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

    @torch.no_grad()
    def _predraft(self, input_ids: torch.LongTensor, drafts: _Drafts | None) -> None:
        """Glue forward over the round's drafts, predict outcomes, pre-draft every predicted branch."""
        t0 = time.perf_counter()
        self.branches = {}
        self.tree_ready = True
        cfg = self.ssd_config
        n0 = input_ids.shape[1]
        n_drafts = 0 if drafts is None else drafts.tokens.numel()
        seq = input_ids[0] if drafts is None else torch.cat([input_ids[0], drafts.tokens])
        # glue: the cache holds the committed prefix and every draft; its last logits predict the depth-L bonus
        to_feed = self._sync_cache(seq[None])
        start = self.fed.numel()
        pos = torch.arange(start, start + to_feed.shape[1], device=seq.device)[None]
        out = self.drafter.model(input_ids=to_feed, position_ids=pos, past_key_values=self.cache, use_cache=True)
        self.fed = torch.cat([self.fed, to_feed[0]])
        n_cache = self.fed.numel()
        roots_j, roots_t = [], []
        for j in range(n_drafts):  # a rejection at depth j: top-F others of q_{j+1}
            drafted = drafts.tokens[j]
            cands = [int(i) for i in drafts.top[j].tolist() if i >= 0]
            picks = [t for t in (int(self.vocab.ids[i]) for i in cands) if t != int(drafted)][: cfg.fan_out]
            roots_j += [j] * len(picks)
            roots_t += picks
        if n_drafts == 0 or not bool(self._is_eos(drafts.tokens[-1:]).any()):  # all accepted: bonus from p
            logits = self._process([seq], self.vocab.logits(out.last_hidden_state[:, -1]).float())
            vals, top = logits.topk(min(cfg.fan_out, logits.shape[-1]), dim=-1)
            cands = [int(i) for i, v in zip(top[0].tolist(), vals[0].tolist()) if v > float("-inf")]
            roots_j += [n_drafts] * len(cands)
            roots_t += [int(self.vocab.ids[i]) for i in cands]
        keep = [b for b, (j, t) in enumerate(zip(roots_j, roots_t))
                if not (self.eos is not None and t in self.eos.tolist())
                and n0 + j + 1 < self.main_model_max_length]
        roots_j = torch.tensor([roots_j[b] for b in keep], dtype=torch.long, device=seq.device)
        roots_t = torch.tensor([roots_t[b] for b in keep], dtype=torch.long, device=seq.device)
        q = roots_j.numel()
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
            mask = self._tree_mask(prefix_len, positions, n_cache, s, q, None)
            if self.window is not None:
                mask = {"full_attention": mask,
                        "sliding_attention": self._tree_mask(prefix_len, positions, n_cache, s, q, self.window)}
            out = self.drafter.model(input_ids=x[None], position_ids=positions[None], attention_mask=mask,
                                     past_key_values=self.cache, use_cache=True)
            logits = self._process(branch_seqs, self.vocab.logits(out.last_hidden_state[0]).float())
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
        eos = self._is_eos(toks_t)
        width = self.vocab.ids.numel()
        for b in range(q):
            n = steps
            if bool(eos[b].any()):
                n = int(eos[b].nonzero()[0]) + 1
            key = (int(roots_j[b]), int(roots_t[b]))
            self.branches[key] = _Branch(toks_t[b, :n], None if laws_t is None else laws_t[b, :n], tops_t[b, :n],
                                         width, base_len=n0 + int(roots_j[b]) + 1)
        self.stats.trees += 1
        self.stats.tree_branches += q
        self.stats.tree_steps += steps
        self.stats.predraft_s += time.perf_counter() - t0

    # --- HF's contract ---------------------------------------------------------------------------------------
    def _lookup(self, input_ids: torch.LongTensor) -> _Branch | None:
        if not self.tree_ready:
            return None
        self.tree_ready = False
        self.stats.lookups += 1
        if self.outcome is None:
            return None
        j, t, length = self.outcome
        branch = self.branches.get((j, t))
        if branch is None or branch.base_len != input_ids.shape[1] or length != input_ids.shape[1]:
            return None
        self.stats.hits += 1
        return branch

    def _next_drafts(self, input_ids: torch.LongTensor, max_new: int) -> _Drafts | None:
        """This round's drafts: the cached branch on a hit, else the backup's."""
        branch = self._lookup(input_ids)
        self.branches = {}
        if branch is not None:
            return _Drafts(branch.tokens[:max_new], None if branch.law is None else branch.law[:max_new],
                           branch.top[:max_new], branch.width)
        if self.ssd_config.backup == "none" and self.stats.rounds > 0:
            return None
        return self._draft_inline(input_ids, max_new)

    def _candidates(self, input_ids: torch.LongTensor, drafts: _Drafts | None):
        """(sequence + drafts, full-vocabulary log q) as HF wants them; q scattered once per round."""
        if drafts is None or drafts.tokens.numel() == 0:
            return input_ids, None
        seq = torch.cat([input_ids, drafts.tokens[None]], dim=1)
        if not self.do_sample:
            return seq, None
        return seq, full_log_q(drafts, self.vocab.ids, self.vocab.k, self.rdk, self.drafter.config.vocab_size)

    @torch.no_grad()
    def get_candidates(self, input_ids: torch.LongTensor, *args, **kwargs):
        if not self.active:
            return super().get_candidates(input_ids, *args, **kwargs)
        input_ids = input_ids.to(self.drafter.device)
        max_new = min(self.num_assistant_tokens, self.main_model_max_length - input_ids.shape[1] - 1)
        if max_new <= 0:
            return input_ids, None
        self.vocab.update(input_ids)
        drafts = self._next_drafts(input_ids, max_new)
        result = self._candidates(input_ids, drafts)
        self._predraft(input_ids, drafts)
        self._t_returned = time.perf_counter()
        return result

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int):
        record_outcome(self, input_ids, num_matches)
        super().update_candidate_strategy(input_ids, scores, num_matches)
        self._maybe_fall_back()

    def _maybe_fall_back(self, compute: str = "sync") -> None:
        """Before ``probe_rounds``: fall back as soon as even perfect hits could not pay (inline, the tree's
        glue + L steps cost at least the L steps it saves); at ``probe_rounds``: with the measured hit rate."""
        cfg = self.ssd_config
        if not (self.active and cfg.fallback) or self.stats.rounds > cfg.probe_rounds:
            return
        best = 1.0 if self.stats.rounds < cfg.probe_rounds else None
        reason = should_fall_back(self.stats, self.num_assistant_tokens, cfg.backup, compute, hit_rate=best)
        if reason is None:
            return
        self.active = False
        self.branches = {}
        self.tree_ready = False
        self.stats.fell_back = True
        self.stats.fallback_reason = reason
        warnings.warn(f"hf_vocabspec: {reason}.", stacklevel=3)
