"""THE draft step: what every drafting loop does with one drafter position, in one place.

Every loop drafts through :class:`DraftStep`: the speculative engine (:mod:`.engine`, every batch size), the
candidate generator inside transformers' loop (:mod:`.candidates`, SSD sessions) and SSD's inline and tree
drafting (:mod:`hf_vocabspec.ssd.generator`). A step is: the drafter's forward on its cache, the draft-space
logits (kept head rows + context tokens, or the full head of an untrimmed assistant), the target's processors
translated to draft space, the draw (argmax or a sample), the map to target ids (RDK may move a kept draw to a
pruned neighbour), the confidence stop, and the exact law q the draw came from (:meth:`DraftStep.q_target`).

Which processors act on drafts: only the stateless ones (``vocabulary.is_stateless``, one list): value-only
warpers as they are; repetition penalty and min-length translated to draft ids; transformers' other pure
processors through the full vocabulary (O(V), warned once). Every other processor (the caller's own,
``prefix_allowed_tokens_fn``, xgrammar, outlines) is the caller's object with state that belongs to the target:
the drafter never calls it. That costs only acceptance, never exactness (the target's processors decide every
emitted token); a grammar can still guide drafts through a draft constraint of its own (:mod:`.constraints`).
"""

from __future__ import annotations

import struct
import warnings
import weakref
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache, StaticCache
from transformers.generation.logits_process import (
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)

from .._io import first_line
from ..modeling import TrimmedDrafter, cache_kwarg, refresh_weight_quantization
from ..rdk import drafter_kernel
from .host import read
from .stats import SpeculationStats
from .vocabulary import DraftVocabulary, is_stateless, is_value_only


def as_float32(value: float) -> float:
    """``value`` rounded to float32, as a Python float (what a float32 tensor of it holds; no tensor read)."""
    return struct.unpack("f", struct.pack("f", value))[0]


@dataclass
class DraftedToken:
    """One drafted position for every row of a batch."""

    idx: torch.Tensor  # (B, 1) draft-space index of the draw
    token: torch.Tensor  # (B, 1) target id (RDK may have moved a kept draw to a pruned neighbour)
    probs: torch.Tensor | None  # (B, n_ids) the law the draw came from (sampling only), over the draft space
    confidence: torch.Tensor | None = None  # (B, 1) float32: the drafter's probability of its draw (None: no
    # confidence threshold is set)
    threshold: torch.Tensor | None = None  # the 0-d float32 threshold ``confidence`` is compared with

    @property
    def unsure(self) -> torch.Tensor | None:
        """(B, 1) bool: the drafter gave its draw less than the confidence threshold (transformers'
        ConfidenceCriteria; None: no threshold is set). One op, on the device; a loop that reads every drafted
        position anyway compares ``confidence`` on the host instead (:attr:`DraftStep.host_threshold`)."""
        return None if self.confidence is None else torch.lt(self.confidence, self.threshold)


class _RowAware:
    """A draft-space processor that needs each row's original batch index (``row_ids``)."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor, row_ids: list[int]) -> torch.Tensor:
        raise NotImplementedError


class _DraftRepetitionPenalty(_RowAware):
    """RepetitionPenaltyLogitsProcessor on draft-space logits: each row penalises its own context's draft ids."""

    def __init__(self, proc: RepetitionPenaltyLogitsProcessor, vocab: DraftVocabulary | None):
        self.penalty = proc.penalty
        self.prompt_ignore_length = proc.prompt_ignore_length
        self.vocab = vocab

    def __call__(self, input_ids, scores, row_ids):
        out = scores.clone()
        for row in range(input_ids.shape[0]):
            ids = input_ids[row]
            ignore = self.prompt_ignore_length
            if isinstance(ignore, torch.Tensor):  # one per original row
                ignore = ignore[row_ids[row] if ignore.numel() > 1 else 0]
            if ignore is not None:
                ids = ids[int(ignore):]
            draft_ids = self.vocab.draft_index(ids) if self.vocab is not None else ids
            draft_ids = torch.unique(draft_ids[draft_ids >= 0])[None, :]
            picked = out[row : row + 1].gather(1, draft_ids)
            picked = torch.where(picked < 0, picked * self.penalty, picked / self.penalty)
            out[row : row + 1] = out[row : row + 1].scatter(1, draft_ids, picked)
        return out


class _DraftMinLength(_RowAware):
    """Min-length / min-new-tokens processors: mask the (kept) EOS rows while the sequence is too short."""

    def __init__(self, proc, vocab: DraftVocabulary | None):
        self.min_length = getattr(proc, "min_length", None)
        self.prompt_length_to_skip = getattr(proc, "prompt_length_to_skip", 0)
        self.min_new_tokens = getattr(proc, "min_new_tokens", None)
        eos = proc.eos_token_id.flatten()
        if vocab is not None:
            eos = vocab.draft_index(eos.to(vocab.t2d.device))
        self.eos_draft_ids = eos[eos >= 0]

    def __call__(self, input_ids, scores, row_ids):
        if self.min_new_tokens is not None:
            too_short = input_ids.shape[-1] - self.prompt_length_to_skip < self.min_new_tokens
        else:
            too_short = input_ids.shape[-1] < self.min_length
        if too_short and self.eos_draft_ids.numel():
            scores = scores.clone()
            scores[:, self.eos_draft_ids.to(scores.device)] = float("-inf")
        return scores


class _FullVocabFallback(_RowAware):
    """One of transformers' own (pure) processors: applied on the full vocabulary, kept rows read back. O(V)."""

    def __init__(self, proc, vocab: DraftVocabulary, vocab_size: int | None = None):
        self.proc = proc
        self.vocab = vocab
        self.vocab_size = vocab_size

    def __call__(self, input_ids, scores, row_ids):
        return self.proc(input_ids, self.vocab.scatter(scores, size=self.vocab_size))[..., self.vocab.ids]


def draft_space_processors(logits_processor, vocab: DraftVocabulary | None, vocab_size: int | None = None) -> list:
    """The target's processors as they act on draft-space logits (over ``vocab.ids``; the full vocabulary when
    ``vocab`` is None). See the module docstring for which ones act on drafts."""
    out = []
    for proc in logits_processor or []:
        if is_value_only(proc):
            out.append(proc)
        elif isinstance(proc, RepetitionPenaltyLogitsProcessor):
            out.append(_DraftRepetitionPenalty(proc, vocab))
        elif isinstance(proc, (MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor)):
            out.append(_DraftMinLength(proc, vocab))
        elif not is_stateless(proc):
            continue  # the caller's object, with state the target owns: verification alone calls it (docstring)
        elif vocab is None:
            out.append(_Plain(proc))
        else:
            warnings.warn(f"hf_vocabspec: {type(proc).__name__} is applied to drafts over the full vocabulary "
                          "(exact, but O(vocabulary) per drafted token).", stacklevel=3)
            out.append(_FullVocabFallback(proc, vocab, vocab_size))
    return out


class _Plain(_RowAware):
    """A transformers processor on an untrimmed assistant's full-vocabulary logits."""

    def __init__(self, proc):
        self.proc = proc

    def __call__(self, input_ids, scores, row_ids):
        return self.proc(input_ids, scores)


def engine_cache(config, static_length: int = 0) -> DynamicCache | StaticCache:
    """A cache with the layer types the config declares (transformers' own construction), ready for rollback;
    ``static_length`` > 0: a static one of that many columns (for a compiled step)."""
    cache = StaticCache(config=config, max_cache_len=static_length) if static_length else DynamicCache(config=config)
    cache.activate_past_recording()
    return cache


# module -> (compile options, compiled __call__): a drafter's compiled step is built once and reused across calls
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compiled_call(module: torch.nn.Module, options: dict):
    """``torch.compile(module.__call__, **options)``, kept per module while the options stay the same (what
    transformers' ``get_compiled_call`` does for a model that generates; a trimmed drafter's body is a base model)."""
    held = _COMPILED.get(module)
    if held is None or held[0] != options:
        held = (options, torch.compile(module.__call__, **options))
        _COMPILED[module] = held
    return held[1]


def static_columns(columns: int) -> int:
    """Columns of a compiled step's static cache holding ``columns``: bucketed (powers of two from 256), so calls of
    other lengths reuse the compiled step instead of recompiling for every cache width (the masked columns cost a
    small model's attention little)."""
    return max(256, 1 << (int(columns) - 1).bit_length())


def graph_input(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """``tensor`` as a compiled call takes it: a copy where it is a view into a larger buffer (the engine's ids and
    position grids). A view's storage offset and strides change from step to step; torch.compile makes them
    symbolic, and CUDA graphs then record a new graph for every value they take."""
    if tensor is None or (tensor.storage_offset() == 0 and tensor.is_contiguous()):
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def graph_call(call):
    """``call`` (a compiled forward) taking its ids and position ids as ``graph_input`` makes them: every compiled
    forward of the engine (the target's verify, the drafter's steps) goes through one of these."""
    def run(*, input_ids, position_ids=None, **kwargs):
        return call(input_ids=graph_input(input_ids), position_ids=graph_input(position_ids), **kwargs)
    return run


class DraftStep:
    """One drafter position for a batch of rows (see the module docstring). Holds the call's draft space."""

    def __init__(self, assistant, logits_processor, *, do_sample: bool, confidence_threshold: float = 0.0,
                 stats: SpeculationStats | None = None, vocab_size: int | None = None):
        self.model = assistant
        self.trimmed = isinstance(assistant, TrimmedDrafter)
        self.do_sample = bool(do_sample)
        self.set_threshold(confidence_threshold)
        self.stats = stats if stats is not None else SpeculationStats()
        self.vocab = None
        self.rdk = None
        if self.trimmed:
            assistant.validate_vocab_map()
            self.vocab = DraftVocabulary(assistant, bool(getattr(assistant, "use_context_tokens", False)),
                                         int(assistant.config.max_context_tokens))
            if self.do_sample and getattr(assistant, "use_rdk", False):
                kernel = drafter_kernel(assistant)
                self.rdk = kernel.to(assistant.device) if kernel is not None else None
        # the TARGET's id space (a padded target has more rows than the drafter's ids)
        self.vocab_size = int(vocab_size or assistant.config.get_text_config().vocab_size)
        self.processors = draft_space_processors(logits_processor, self.vocab, self.vocab_size)
        self.constraint = None  # a draft constraint (.constraints.TrackedConstraint) the engine sets for a call
        self.value_only = all(is_value_only(p) for p in self.processors)
        embedding = self.body.get_input_embeddings()
        rows = getattr(embedding, "num_embeddings", None)
        self.embedding_rows = rows if rows is not None and rows < self.vocab_size else None
        # counters of draws (context tokens, RDK moves) kept on the device until ``flush_counts`` (the engine sets
        # this: no read per drafted token); False: read at once (transformers' loop, SSD)
        self.defer_counts = False
        self._counts: dict[str, torch.Tensor] = {}
        # ``compile``: a static cache of this many columns and the compiled forward for every step but the first
        self.static_length = 0
        self._compiled = None
        self.fallible = False  # ``compile(fallible=True)``: a failing compile falls back to eager steps

    def compile(self, options: dict, static_length: int, fallible: bool = False) -> None:
        """Run the drafter's forwards after its first (the prompt's) compiled, on static caches (``new_cache``).
        ``fallible`` (compile_draft_step="auto"): a compiled call that raises (a compile that fails) is dropped, with
        one warning and its reason in ``stats.draft_compile_failure``, and the steps run eager on the same cache."""
        self.static_length = static_columns(static_length)
        body = self.body if self.trimmed else self.model
        refresh_weight_quantization(body)  # its traced int8/int4 layers do not check their weights themselves
        self._compiled = graph_call(compiled_call(body, options))
        self.fallible = fallible

    def _forward(self, eager, compiled: bool, **kwargs):
        """``eager(**kwargs)``, or the compiled call where ``compiled`` and the step compiles (``compile``)."""
        if not compiled or self._compiled is None:
            return eager(**kwargs)
        if not self.fallible:
            return self._compiled(**kwargs)
        try:
            return self._compiled(**kwargs)
        except Exception as error:  # compile_draft_step="auto": a failed compile costs speed, never the call
            reason = first_line(error, 240, with_type=True)
            self._compiled = None
            self.stats.draft_compile_failure = reason
            warnings.warn(f"hf_vocabspec: compiling the drafter's steps failed ({reason}); they run eager from now "
                          "on (compile_draft_step=\"auto\"). Set drafter.compile_draft_step = False to skip the "
                          "attempt.", stacklevel=2)
            return eager(**kwargs)

    @property
    def compiled(self) -> bool:
        return self._compiled is not None

    # --- the drafter's forward ----------------------------------------------------------------------------
    def same_body(self, target) -> bool:
        """Whether the drafter's body is the target's: the same module class and configuration, the same parameter
        names and shapes, and every value the target's in the drafter's dtype (a drafter trimmed from the target
        itself, pair G). Its cache over a prompt is then the target's (what ``SpeculativeEngine`` takes instead of
        re-reading the prompt); its int8 copies or fast linears would only have rounded it differently. Reads every
        parameter once where the structure matches: call it once per pair (the engine keeps the answer)."""
        mine = self.body if self.trimmed else getattr(self.model, "base_model", None)
        theirs = getattr(target, "base_model", None)
        if mine is None or theirs is None or type(mine) is not type(theirs):
            return False
        if mine is theirs:
            return True
        ignored = {"_name_or_path", "dtype", "torch_dtype", "transformers_version", "architectures", "_commit_hash",
                   "use_cache", "_attn_implementation_autoset"}
        a, b = mine.config.to_dict(), theirs.config.to_dict()
        if {k: v for k, v in a.items() if k not in ignored} != {k: v for k, v in b.items() if k not in ignored}:
            return False
        ours, target_params = dict(mine.named_parameters()), dict(theirs.named_parameters())
        if ours.keys() != target_params.keys() or any(ours[k].shape != target_params[k].shape for k in ours):
            return False
        with torch.no_grad():
            return all(x.data_ptr() == y.data_ptr() or torch.equal(x, y.to(x.dtype))
                       for x, y in ((ours[k], target_params[k]) for k in ours))

    @property
    def body(self):
        """The module whose forward the cache belongs to (a trimmed drafter's body, else the whole model)."""
        return self.model.model if self.trimmed else self.model

    def new_cache(self) -> DynamicCache:
        config = self.model.model.config if self.trimmed else self.model.config.get_text_config(decoder=True)
        return engine_cache(config, self.static_length)

    def _in_range(self, input_ids: torch.Tensor) -> torch.Tensor:
        """A padded target's ids past the drafter's embedding (untrained rows a target rarely emits) are fed as
        id 0: only the drafts after them suffer, never the output."""
        rows = self.embedding_rows
        return input_ids if rows is None else torch.where(input_ids < rows, input_ids, 0)

    def hidden(self, input_ids, cache, attention_mask=None, position_ids=None, compiled: bool = False,
               **kwargs) -> torch.Tensor:
        """Last hidden states (trimmed drafter) of a forward on ``cache``; (B, n, hidden). ``compiled``: through
        the compiled forward (``compile``)."""
        input_ids = self._in_range(input_ids)
        out = self._forward(self.body, compiled, input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids, use_cache=True, **kwargs, **{cache_kwarg(self.body): cache})
        return out.last_hidden_state

    def logits(self, input_ids, cache, attention_mask=None, position_ids=None, compiled: bool = False) -> torch.Tensor:
        """Draft-space logits (B, n_ids) float32 at the last fed position."""
        if self.trimmed:
            hidden = self.hidden(input_ids, cache, attention_mask, position_ids, compiled=compiled)
            return self.vocab.logits(hidden[:, -1]).float()
        out = self._forward(self.model, compiled, input_ids=self._in_range(input_ids), attention_mask=attention_mask,
                            position_ids=position_ids, use_cache=True, logits_to_keep=1,
                            **{cache_kwarg(self.model): cache})
        return out.logits[:, -1].float()

    def draft_width(self) -> int:
        """Width of the draft-space law (kept ids + context tokens; an untrimmed assistant's logits)."""
        if self.vocab is not None:
            return int(self.vocab.ids.numel())
        return int(self.model.get_output_embeddings().weight.shape[0])

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-space logits of hidden states (trimmed drafters; SSD's tree steps)."""
        return self.vocab.logits(hidden).float()

    # --- processors, draw, target ids ---------------------------------------------------------------------
    def process(self, logits: torch.Tensor, contexts, row_ids: list[int] | None = None) -> torch.Tensor:
        """The draft-space processors. ``contexts``: a (B, n) tensor, or one 1-D sequence per row in the layout
        the target's processors see (prompt as given + generated + drafts so far); ``row_ids``: each row's
        original batch index."""
        if not self.processors:
            return logits
        if self.value_only:
            for proc in self.processors:
                logits = proc(contexts if isinstance(contexts, torch.Tensor) else None, logits)
            return logits
        row_ids = list(range(logits.shape[0])) if row_ids is None else row_ids
        rows = []
        for b in range(logits.shape[0]):
            seq = contexts[b][None]
            row = logits[b : b + 1]
            for proc in self.processors:
                row = proc(seq, row, [row_ids[b]]) if isinstance(proc, _RowAware) else proc(seq, row)
            rows.append(row)
        out = torch.cat(rows)
        dead = ~torch.isfinite(out).any(dim=-1)  # nothing allowed in draft space: draft unconstrained
        return torch.where(dead[:, None], logits, out)  # (no read of ``dead``: a host sync per drafted token)

    def constrain(self, logits: torch.Tensor, row_ids: list[int]) -> torch.Tensor:
        """Each row's draft-space logits masked to what its draft constraint allows (a row it leaves unconstrained,
        or whose allowed tokens all lie outside the draft space or on logits that are already -inf, drafts as
        without the constraint). Called before the draft-space processors (``__call__``)."""
        out = logits
        ids = self.vocab.ids if self.vocab is not None else torch.arange(logits.shape[-1], device=logits.device)
        for b, row in enumerate(row_ids):
            allowed = self.constraint.allowed(row)
            if allowed is None:
                continue
            allowed = allowed.to(logits.device)
            if allowed.dtype == torch.bool:  # a mask over target ids
                ok = allowed[ids.clamp(max=allowed.numel() - 1)] & (ids < allowed.numel())
            else:  # allowed target ids
                ok = torch.zeros(ids.numel(), dtype=torch.bool, device=logits.device)
                idx = self.vocab.draft_index(allowed) if self.vocab is not None else allowed[allowed < ids.numel()]
                ok[idx[idx >= 0]] = True
            ok &= torch.isfinite(logits[b])
            if out is logits:
                out = logits.clone()
            # a row whose allowed tokens are all outside (ok all False) keeps its logits; chosen on the device
            out[b] = torch.where(ok.any(), logits[b].masked_fill(~ok, float("-inf")), logits[b])
        return out

    def draw(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(idx (B, 1), probs (B, n_ids) or None): argmax, or a sample from softmax(logits)."""
        if self.do_sample:
            probs = logits.softmax(dim=-1)
            return torch.multinomial(probs, 1), probs
        return logits.argmax(dim=-1, keepdim=True), None

    def to_tokens(self, idx: torch.Tensor) -> torch.Tensor:
        """Draft indices -> target ids; RDK moves kept draws to a neighbour (j ~ M[i])."""
        if self.vocab is None:
            return idx
        tokens = torch.take(self.vocab.ids, idx)
        if self.vocab.num_context:  # (nothing to count without context tokens)
            self._count("context_proposed", (idx >= self.vocab.k).sum())
        if self.rdk is not None:  # rows of context-token draws keep them (chosen on the device: no read)
            kept = idx < self.vocab.k
            moved = self.rdk.sample(idx.clamp_max(self.vocab.k - 1))
            moved = torch.where(kept, moved, tokens)
            self._count("pruned_proposed", (moved != tokens).sum())
            tokens = moved
        return tokens

    def _count(self, name: str, value: torch.Tensor) -> None:
        if not self.defer_counts:
            setattr(self.stats, name, getattr(self.stats, name) + read(value, self.stats))
            return
        held = self._counts.get(name)
        self._counts[name] = value if held is None else held + value

    def flush_counts(self) -> None:
        """The deferred counters into the stats: one read for all of them (once per call)."""
        if not self._counts:
            return
        names = list(self._counts)
        values = read(torch.stack([self._counts[n] for n in names]), self.stats, setup=True)
        for name, value in zip(names, values):
            setattr(self.stats, name, getattr(self.stats, name) + value)
        self._counts = {}

    def set_threshold(self, value: float | None) -> None:
        """The confidence stop's threshold (0: none), also as a 0-d float32 tensor (compared without wrapping a Python
        float every draft) and on the host as the same float32 value (a host comparison decides as the device's
        would). The engine moves it between rounds where it adapts it (.confidence)."""
        self.confidence_threshold = float(value or 0.0)
        self._threshold = torch.tensor(self.confidence_threshold, dtype=torch.float32)
        self.host_threshold = as_float32(self.confidence_threshold)

    def draw_with_confidence(self, logits: torch.Tensor):
        """(idx, probs, confidence (B, 1)): the draw and the drafter's probability of it, for transformers'
        ConfidenceCriteria (greedy or sampled: the stop depends on the drafter's draws only, so verification stays
        exact). Greedy: one ``max`` of the law gives the argmax and its probability (the law's largest) together."""
        if self.do_sample:
            idx, probs = self.draw(logits)
            return idx, probs, probs.gather(-1, idx)
        confidence, idx = logits.softmax(dim=-1).max(dim=-1, keepdim=True)
        return idx, None, confidence

    def __call__(self, input_ids, cache, contexts, row_ids=None, attention_mask=None,
                 position_ids=None, compiled: bool = False) -> DraftedToken:
        """Feed ``input_ids`` after ``cache`` and draft the next position of every row."""
        logits = self.logits(input_ids, cache, attention_mask, position_ids, compiled=compiled)
        if self.constraint is not None:  # first, as target-only applies the caller's processors before its warpers
            logits = self.constrain(logits, row_ids if row_ids is not None else list(range(logits.shape[0])))
        if self.processors:
            logits = self.process(logits, contexts, row_ids)
        confidence = None
        if self.confidence_threshold:
            idx, probs, confidence = self.draw_with_confidence(logits)
        else:
            idx, probs = self.draw(logits) if self.do_sample else (logits.argmax(dim=-1, keepdim=True), None)
        vocab = self.vocab
        # the common case in one op: draft index -> target id (``to_tokens`` without RDK or context tokens)
        token = (torch.take(vocab.ids, idx) if vocab is not None and self.rdk is None and not vocab.num_context
                 else self.to_tokens(idx))
        self.stats.draft_steps += 1
        return DraftedToken(idx, token, probs, confidence, self._threshold)

    # --- the exact law --------------------------------------------------------------------------------------
    def q_target(self, probs: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """(..., n_ids) draft-space law -> (..., V) the law of the TARGET id a draft step returns (RDK: q_RDK =
        M^T q' plus the context tokens' own mass)."""
        if self.vocab is None:
            return probs[..., :vocab_size] if probs.shape[-1] > vocab_size else probs
        if self.rdk is not None:
            k = self.vocab.k
            q = self.rdk.redistribute(probs[..., :k])
            if self.vocab.num_context:
                q.index_add_(-1, self.vocab.ids[k:], probs[..., k:])
            return torch.nn.functional.pad(q, (0, vocab_size - q.shape[-1])) if q.shape[-1] < vocab_size else q
        return self.vocab.scatter(probs, fill=0.0, size=vocab_size)
