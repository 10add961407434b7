"""Drafting with a TrimmedDrafter inside ``target.generate(assistant_model=drafter)``.

Design (why it looks like this):
- transformers has no public hook for a user-supplied candidate generator, so at import we wrap
  ``GenerationMixin._get_candidate_generator`` (keyword-called, stable 4.57 -> 5.23): when the assistant is
  a :class:`TrimmedDrafter` it returns our :class:`TrimmedCandidateGenerator`; anything else goes to the
  original untouched. The verification loop (``_assisted_decoding``, ``_speculative_sampling``) stays HF's.
- The generator subclasses ``AssistedCandidateGenerator`` for its bookkeeping (assistant generation
  config, num_assistant_tokens schedule, main-model max length) but runs its own draft loop: body forward,
  trimmed head, logits processors translated to draft space, sample/argmax, map to target ids. No step
  touches the full target vocabulary; the full-vocabulary q is materialised once per round, and only
  under sampling (greedy verification does not read it).
- Lossless by construction: under sampling the returned q is exactly the distribution each draft token
  was drawn from (float32, scattered with -inf on pruned ids), and HF's verifier accepts/resamples
  against the target's p. The target's processors (temperature, top-k/p, repetition penalty) are applied
  ONCE to the draft (no double temperature as in HF's assistant.generate path).
- RDK (rdk.py): with a kernel attached, ``drafter.use_rdk`` and do_sample=True, each draw i ~ q' is moved
  to j ~ M[i] (possibly a pruned token) and the returned q is the exact q_RDK = Mᵀq', built from the same
  float32 kernel both steps use. Under greedy the kernel is not used (see docs/rdk.md).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
from transformers import GenerationMixin
from transformers.cache_utils import DynamicCache
from transformers.generation.candidate_generator import AssistedCandidateGenerator
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

from . import verify_head as _verify_head
from .drafter import TrimmedDrafter, VocabularyMapError
from .rdk import drafter_kernel

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


@dataclass
class SpeculationStats:
    """Counters of one ``generate`` call (field terms as in vLLM/NeMo)."""

    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    draft_steps: int = 0
    pruned_proposed: int = 0  # RDK draws that landed on a pruned token
    context_proposed: int = 0  # drafts of pruned tokens taken from the context (context tokens)
    per_round_accepted: list[int] = field(default_factory=list)
    per_round_proposed: list[int] = field(default_factory=list)

    def add(self, other: SpeculationStats) -> SpeculationStats:
        """Accumulate another call's counters into this one (per-round lists are concatenated)."""
        for name in ("rounds", "proposed", "accepted", "draft_steps", "pruned_proposed", "context_proposed"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.per_round_accepted += other.per_round_accepted
        self.per_round_proposed += other.per_round_proposed
        return self

    @property
    def acceptance_rate(self) -> float:
        """accepted / proposed draft tokens."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """tau = 1 + accepted / verify rounds (counts the bonus token)."""
        return 1.0 + self.accepted / self.rounds if self.rounds else 0.0


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
        """Add pruned ids first seen in ``input_ids`` since the last call (call between rounds only)."""
        if not self.use_context:
            return
        new = input_ids[0, self.scanned :]
        self.scanned = input_ids.shape[1]
        room = self.max_context - self.num_context
        if room <= 0 or new.numel() == 0:
            return
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
        ids = input_ids[0]
        if isinstance(self.prompt_ignore_length, int):
            ids = ids[self.prompt_ignore_length :]
        elif isinstance(self.prompt_ignore_length, torch.Tensor):
            ids = ids[int(self.prompt_ignore_length[0]) :]
        draft_ids = self.vocab.t2d[ids]
        draft_ids = torch.unique(draft_ids[draft_ids >= 0])[None, :]
        picked = scores.gather(1, draft_ids)
        picked = torch.where(picked < 0, picked * self.penalty, picked / self.penalty)
        return scores.scatter(1, draft_ids, picked)


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


class TrimmedCandidateGenerator(AssistedCandidateGenerator):
    """Drafts in the trimmed vocabulary; returns target ids and (under sampling) the exact full-vocab q."""

    def __init__(
        self,
        input_ids: torch.LongTensor,
        assistant_model: TrimmedDrafter,
        generation_config,
        model_kwargs: dict,
        inputs_tensor: torch.Tensor | None = None,
        logits_processor=None,
        target_vocab_size: int | None = None,
    ):
        super().__init__(input_ids, assistant_model, generation_config, model_kwargs, inputs_tensor, logits_processor)
        drafter = assistant_model
        drafter.validate_vocab_map()
        if target_vocab_size is not None and target_vocab_size != drafter.config.vocab_size:
            raise VocabularyMapError(
                f"The drafter was trimmed for a vocabulary of {drafter.config.vocab_size} tokens but the target has "
                f"{target_vocab_size}: drafter and target must share a tokenizer. Trim a drafter that uses the "
                "target's tokenizer (hf_vocabspec.trim_drafter)."
            )
        if generation_config.assistant_ensemble_weight is not None:
            raise ValueError(
                "assistant_ensemble_weight makes verification lossy; hf_vocabspec only does lossless speculative "
                "decoding. Remove `assistant_ensemble_weight`."
            )
        # num_assistant_tokens & co: a value passed to target.generate() (anything but the library default)
        # wins over the drafter's generation_config; HF ignores it otherwise (transformers #40739).
        defaults = generation_config._get_default_generation_params()
        for name in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold"):
            value = getattr(generation_config, name, None)
            if value is not None and value != defaults.get(name):
                setattr(self.assistant_generation_config, name, value)
        self.num_assistant_tokens = self.assistant_generation_config.num_assistant_tokens
        self.assistant_confidence_threshold = self.assistant_generation_config.assistant_confidence_threshold
        self.drafter = drafter
        self.do_sample = bool(generation_config.do_sample)
        self.vocab = DraftVocabulary(drafter, bool(getattr(drafter, "use_context_tokens", False)),
                                     int(drafter.config.max_context_tokens))
        self.draft_processors = draft_space_processors(self.logits_processor, self.vocab)
        eos = generation_config._eos_token_tensor if hasattr(generation_config, "_eos_token_tensor") else None
        if eos is None and generation_config.eos_token_id is not None:
            eos = torch.tensor(generation_config.eos_token_id).flatten()
        self.eos = eos.to(drafter.device) if eos is not None else None
        self.cache = None
        self.fed = torch.empty(0, dtype=torch.long, device=drafter.device)
        self.rdk = None
        if self.do_sample and getattr(drafter, "use_rdk", False):
            kernel = drafter_kernel(drafter)
            self.rdk = kernel.to(drafter.device) if kernel is not None else None
        self.stats = SpeculationStats()
        drafter.last_speculation_stats = self.stats

    def _sync_cache(self, input_ids: torch.LongTensor) -> torch.LongTensor:
        """Roll the drafter cache back to the longest prefix it shares with input_ids; return ids to feed."""
        if self.cache is None:
            self.cache = DynamicCache(config=self.drafter.model.config)
            if hasattr(self.cache, "activate_past_recording"):
                self.cache.activate_past_recording()
        seq = input_ids[0]
        n = min(self.fed.numel(), seq.numel() - 1)
        same = self.fed[:n] == seq[:n]
        keep = n if bool(same.all()) else int((~same).nonzero()[0])
        remove = self.fed.numel() - keep
        if self.fed.numel():  # crop() on a never-filled sliding layer fails
            self.cache.crop(-remove)
        self.fed = self.fed[:keep]
        return input_ids[:, keep:]

    @torch.no_grad()
    def get_candidates(self, input_ids: torch.LongTensor, *args, **kwargs):
        drafter = self.drafter
        input_ids = input_ids.to(drafter.device)
        cur_len = input_ids.shape[1]
        max_new = min(int(self.num_assistant_tokens), self.main_model_max_length - cur_len - 1)
        if max_new <= 0:
            return input_ids, None
        to_feed = self._sync_cache(input_ids)
        vocab = self.vocab
        vocab.update(input_ids)  # fixed for the whole round: every draft of it uses the same draft space
        seq = input_ids
        drafted_logits = []
        drafted_ids = []
        for _ in range(max_new):
            start = self.fed.numel()
            positions = torch.arange(start, start + to_feed.shape[1], device=drafter.device)[None, :]
            out = drafter.model(input_ids=to_feed, position_ids=positions, past_key_values=self.cache, use_cache=True)
            self.fed = torch.cat([self.fed, to_feed[0]])
            logits = vocab.logits(out.last_hidden_state[:, -1]).float()
            for proc in self.draft_processors:
                logits = proc(seq, logits)
            if self.do_sample:
                probs = logits.softmax(dim=-1)
                idx = torch.multinomial(probs, num_samples=1)
                drafted_logits.append(probs if self.rdk is not None else logits)
            else:
                idx = logits.argmax(dim=-1, keepdim=True)
            token = vocab.ids[idx]  # (1, 1) target id
            if self.rdk is not None and int(idx) < vocab.k:
                token = self.rdk.sample(idx)  # j ~ M[i]: the kept token or one of its pruned neighbours
                self.stats.pruned_proposed += int((token != drafter.d2t[idx]).item())
            if vocab.num_context:  # (the int() is a device sync: skipped when there is nothing to count)
                self.stats.context_proposed += int(idx) >= vocab.k
            drafted_ids.append(token)
            seq = torch.cat([seq, token], dim=1)
            to_feed = token
            self.stats.draft_steps += 1
            if self.eos is not None and bool(torch.isin(token, self.eos).any()):
                break
            if self.assistant_confidence_threshold and not self.do_sample:
                if float(logits.softmax(dim=-1).max()) < self.assistant_confidence_threshold:
                    break
        candidate_logits = None
        if self.do_sample:
            stacked = torch.stack(drafted_logits, dim=1)  # (1, L, K + C)
            if self.rdk is not None:  # exact q_RDK = M^T q' (+ context tokens' own mass); HF softmaxes it back
                q = self.rdk.redistribute(stacked[..., : vocab.k])
                if vocab.num_context:
                    q.index_add_(-1, vocab.ids[vocab.k :], stacked[..., vocab.k :])
                candidate_logits = q.log()
            else:
                candidate_logits = vocab.scatter(stacked)  # once per round: (1, L, V)
        return seq, candidate_logits

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int):
        proposed = scores.shape[1] - 1
        self.stats.rounds += 1
        self.stats.proposed += proposed
        self.stats.accepted += int(num_matches)
        self.stats.per_round_accepted.append(int(num_matches))
        self.stats.per_round_proposed.append(proposed)
        schedule = self.assistant_generation_config.num_assistant_tokens_schedule
        if schedule in {"heuristic", "heuristic_transient"}:
            if num_matches == proposed:
                self.num_assistant_tokens += 2
            else:
                self.num_assistant_tokens = max(1, self.num_assistant_tokens - 1)


_ORIGINAL_GET_CANDIDATE_GENERATOR = None
_ORIGINAL_VALIDATE_GENERATION_MODE = None
_FINGERPRINTS: dict[int, tuple[object, str]] = {}  # id(tokenizer) -> (tokenizer, sha256): hashed once per object


def _check_trimmed_assistant(target, drafter: TrimmedDrafter, generation_config, mode_kwargs: dict) -> None:
    """OUR errors for a trimmed drafter that cannot serve this target, raised before transformers' checks (which
    would advise universal assisted decoding: the wrong fix, the drafter must share the target's tokenizer)."""
    from .drafter import check_draft_length, tokenizer_sha256

    fix = "trim a drafter with the target's tokenizer: hf_vocabspec.trim_drafter(base, ids, tokenizer=target_tokenizer)."
    n = getattr(generation_config, "num_assistant_tokens", None)
    if n is not None:
        check_draft_length(n)
    target_vocab = target.config.get_text_config().vocab_size
    if target_vocab != drafter.config.vocab_size:
        raise VocabularyMapError(f"This trimmed drafter maps into a vocabulary of {drafter.config.vocab_size} tokens "
                                 f"but the target has {target_vocab}: drafter and target must share a tokenizer; {fix}")
    tokenizer = mode_kwargs.get("tokenizer")
    recorded = drafter.config.target_tokenizer_sha256
    if tokenizer is not None and recorded:
        cached = _FINGERPRINTS.get(id(tokenizer))
        if cached is None or cached[0] is not tokenizer:
            cached = _FINGERPRINTS[id(tokenizer)] = (tokenizer, tokenizer_sha256(tokenizer))
        if cached[1] != recorded:
            raise VocabularyMapError(f"The tokenizer passed to generate() ({getattr(tokenizer, 'name_or_path', '')!r}) "
                                     f"is not the one this drafter was trimmed with (tokenizer fingerprints differ); {fix}")
# transformers versions whose `_get_candidate_generator` / `_assisted_decoding` contract this routing was read
# from (keyword call, CandidateGenerator API); pyproject pins the same range.
SUPPORTED_TRANSFORMERS = ((5, 18), (5, 24))


def _check_transformers_version() -> None:
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    lo, hi = SUPPORTED_TRANSFORMERS
    if not (lo <= (major, minor) < hi) or not hasattr(GenerationMixin, "_get_candidate_generator"):
        raise ImportError(
            f"hf_vocabspec supports transformers >={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]} (found {transformers.__version__}): "
            f"pip install 'transformers>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]}'."
        )


def install() -> None:
    """Route ``assistant_model=<TrimmedDrafter>`` to our generator; idempotent, leaves other cases alone.

    transformers has no public hook for a user-supplied candidate generator, so this wraps
    ``GenerationMixin._get_candidate_generator`` (done on ``import hf_vocabspec``; :func:`uninstall` undoes it).
    """
    global _ORIGINAL_GET_CANDIDATE_GENERATOR
    if _ORIGINAL_GET_CANDIDATE_GENERATOR is not None:
        return
    _check_transformers_version()
    original = GenerationMixin._get_candidate_generator
    _ORIGINAL_GET_CANDIDATE_GENERATOR = original

    def _get_candidate_generator(self, *args, **kwargs):
        assistant = kwargs.get("assistant_model")
        # hf_vocabspec.ssd: a session object builds its own generator (SSD, issue #14)
        factory = getattr(assistant, "_hf_vocabspec_candidate_generator", None)
        if factory is not None and not args:
            return factory(**kwargs, target_vocab_size=self.config.get_text_config().vocab_size)
        if not isinstance(assistant, TrimmedDrafter):
            return original(self, *args, **kwargs)
        if args:
            raise TypeError("hf_vocabspec expects transformers to call _get_candidate_generator with keywords.")
        return TrimmedCandidateGenerator(
            input_ids=kwargs["input_ids"],
            assistant_model=assistant,
            generation_config=kwargs["generation_config"],
            model_kwargs=kwargs["model_kwargs"],
            inputs_tensor=kwargs.get("inputs_tensor"),
            logits_processor=kwargs.get("logits_processor"),
            target_vocab_size=self.config.get_text_config().vocab_size,
        )

    _get_candidate_generator.__wrapped__ = original
    GenerationMixin._get_candidate_generator = _get_candidate_generator

    global _ORIGINAL_VALIDATE_GENERATION_MODE  # issue #12: our mismatch errors before transformers' advice
    original_validate = GenerationMixin._validate_generation_mode
    _ORIGINAL_VALIDATE_GENERATION_MODE = original_validate

    def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs, *args, **kwargs):
        assistant = (generation_mode_kwargs or {}).get("assistant_model")
        if isinstance(assistant, TrimmedDrafter):
            _check_trimmed_assistant(self, assistant, generation_config, generation_mode_kwargs)
        return original_validate(self, generation_mode, generation_config, generation_mode_kwargs, *args, **kwargs)

    _validate_generation_mode.__wrapped__ = original_validate
    GenerationMixin._validate_generation_mode = _validate_generation_mode
    _verify_head.install()  # issue #15: verify-time LM head for these calls only (verify_head.py)


def uninstall() -> None:
    """Give transformers back its own ``_get_candidate_generator`` (a TrimmedDrafter then drafts through HF's
    generic path: still lossless, but O(vocabulary) per drafted token)."""
    global _ORIGINAL_GET_CANDIDATE_GENERATOR
    if _ORIGINAL_GET_CANDIDATE_GENERATOR is None:
        return
    GenerationMixin._get_candidate_generator = _ORIGINAL_GET_CANDIDATE_GENERATOR
    _ORIGINAL_GET_CANDIDATE_GENERATOR = None
    global _ORIGINAL_VALIDATE_GENERATION_MODE
    if _ORIGINAL_VALIDATE_GENERATION_MODE is not None:
        GenerationMixin._validate_generation_mode = _ORIGINAL_VALIDATE_GENERATION_MODE
        _ORIGINAL_VALIDATE_GENERATION_MODE = None
    _verify_head.uninstall()  # issue #15


install()
