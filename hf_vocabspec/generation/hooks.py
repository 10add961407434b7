"""THE seam to transformers' private generation API: the only module that touches it, version guard beside it.

transformers has no public hook for a user-supplied candidate generator or verification loop, so
:func:`install` (run on ``import hf_vocabspec``; :func:`uninstall` undoes it) wraps five private methods of
``GenerationMixin``, and only acts when the assistant is ours (a :class:`TrimmedDrafter` or an hf_vocabspec
session object exposing ``_hf_vocabspec_candidate_generator``); every other call goes to the original untouched:

- ``_validate_generation_mode``: our checks first (vocabulary, tokenizer fingerprint, draft length), so a
  mismatched drafter gets our one-line fix instead of transformers' advice to use universal assisted decoding;
  ``num_return_sequences > 1`` is allowed for our drafters (the engine serves it); assistant_model together
  with prompt lookup is refused.
- ``_validate_model_kwargs``: a drafter-only setting passed to generate() (``batched_speculation``, the
  drafter's runtime switches) is refused in one line naming where it is set (any assistant: it runs first).
- ``_prepare_model_inputs``: the caller's attention mask is checked as given (before generate drops an all-ones
  mask or indexes a 1-D one).
- ``_get_candidate_generator``: SSD sessions draft through their candidate generator inside HF's loop.
- ``_assisted_decoding``: checks the inputs (ids in range, non-empty, left padding), refuses in one line what
  cannot be kept exact (CFG, a prefilled cache, caches without per-row rollback, ...), enters the verify-time
  head, and runs every batch size through our engine (:mod:`.engine`); an untrimmed assistant with the target's
  vocabulary, which transformers refuses at batch > 1, also runs there (its full head drafts).

What moved in transformers and is absorbed here: the cache kwarg (``cache`` from 5.24, see
``modeling.cache_kwarg``), ``_get_candidate_generator`` called with keywords (4.57 -> 5.24).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import inspect

import torch
from transformers import GenerationMixin
from transformers.cache_utils import DynamicCache, DynamicLayer, StaticCache
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .. import verify_head as _verify_head
from .._versions import check, supported_range
from ..compatibility import DEFAULT_FIX, check_compatibility, target_rows, target_tokenizer_fingerprint
from ..configuration import (
    CAPPED_FROM_ROWS,
    capped_draft_length,
    check_batched_speculation,
    check_constrain_drafts,
    check_drafting_settings,
    drafter_setting_error,
)
from ..modeling import TrimmedDrafter, forward_has_cache, position_limit
from . import autocompile
from .candidates import TrimmedCandidateGenerator
from .engine import SpeculativeEngine, compiled_graphs, static_layers_supported, unsupported_layer_types
from .vocabulary import is_stateless

_ORIGINALS: dict[str, object] = {}
# Set by _validate_generation_mode for the call under way: whether its assistant is ours (then
# _prepare_model_inputs checks the caller's attention mask as given, before generate drops an all-ones mask).
_OURS_CALL: contextvars.ContextVar[bool] = contextvars.ContextVar("hf_vocabspec_ours_call", default=False)
_TRANSFORMERS_LOOP: contextvars.ContextVar[bool] = contextvars.ContextVar("hf_vocabspec_hf_loop", default=False)


@contextlib.contextmanager
def transformers_loop():
    """Within this block, batch-1 calls with a trimmed drafter run in transformers' own assisted loop with our
    candidate generator (the path before the engine), for benches that compare the two. Not exact under
    stopping criteria that fire mid-round (transformers keeps the tokens accepted after them)."""
    token = _TRANSFORMERS_LOOP.set(True)
    try:
        yield
    finally:
        _TRANSFORMERS_LOOP.reset(token)


class _ConfigView:
    """What transformers' mode validation reads of an assistant: its config (here with the padded target's size)."""

    def __init__(self, config):
        self.config = config


def check_transformers_version() -> None:
    """The installed transformers must be in the range pyproject declares (and CI tests): one line with the pip
    command otherwise. The range's one home is pyproject.toml, read back from the installed metadata."""
    check("transformers")
    if not hasattr(GenerationMixin, "_get_candidate_generator"):
        raise ImportError("This transformers has no GenerationMixin._get_candidate_generator: install a supported "
                          f"release: pip install 'transformers{supported_range('transformers')}'.")


def is_ours(assistant) -> bool:
    """Whether hf_vocabspec drives this assistant (a trimmed drafter or one of our session objects)."""
    return isinstance(assistant, TrimmedDrafter) or getattr(assistant, "_hf_vocabspec_candidate_generator", None) is not None


def trimmed_drafter_of(assistant) -> TrimmedDrafter | None:
    """The trimmed drafter that drafts for ``assistant``: itself, or the ``drafter`` of one of our session objects
    (SSD); None for any other assistant."""
    if isinstance(assistant, TrimmedDrafter):
        return assistant
    drafter = getattr(assistant, "drafter", None) if is_ours(assistant) else None
    return drafter if isinstance(drafter, TrimmedDrafter) else None


def check_trimmed_assistant(target, drafter: TrimmedDrafter, generation_config, mode_kwargs: dict) -> None:
    """OUR errors for a trimmed drafter (or an SSD session's) that cannot serve this target or the tokenizer passed to
    generate, raised before transformers' checks (which would advise universal assisted decoding: the wrong fix, the
    drafter must share the target's tokenizer). The compatibility rule itself is hf_vocabspec.compatibility's."""
    # the drafting settings, where they were set: passed to generate() (or on the target's generation_config), and
    # the drafter's own generation_config (read when generate() leaves them at transformers' defaults)
    for config, where in ((generation_config, "{}"),
                          (drafter.generation_config, "drafter.generation_config.{}")):
        if config is not None:
            check_drafting_settings(config, where)
    tokenizer = mode_kwargs.get("tokenizer")
    check_compatibility(drafter, target=target, tokenizer=tokenizer)
    if tokenizer is None:  # no tokenizer passed: compare the one saved with the target, where one is at hand
        at_hand = target_tokenizer_fingerprint(target)
        if at_hand is not None:
            check_compatibility(drafter, tokenizer=at_hand[0],
                                fix=f"it is the tokenizer saved with the target ({at_hand[1]}); {DEFAULT_FIX}")


SSD_BATCH_ONE = ("SSD runs at batch 1 (this call has {rows} rows: prompts x num_return_sequences): call generate once "
                 "per prompt and sequence with the SSD session, or pass the trimmed drafter itself as assistant_model "
                 "for batched generation.")


def check_inputs(target, assistant, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 max_length: int | None = None) -> None:
    """Bad input to a speculative call fails here, in one line, before any forward pass.

    ``max_length``: the total length generate will reach (prompt + max_new_tokens), checked against each model's
    position limit (read under its architecture's name, see ``modeling.position_limit``); None checks the prompt."""
    vocab = target.config.get_text_config().vocab_size
    if input_ids.shape[-1] == 0:
        raise ValueError("The prompt is empty (input_ids has 0 tokens): give at least one token, e.g. the BOS token.")
    if input_ids.numel() and (int(input_ids.max()) >= vocab or int(input_ids.min()) < 0):
        bad = int(input_ids.max()) if int(input_ids.max()) >= vocab else int(input_ids.min())
        raise ValueError(f"input_ids holds token id {bad}, outside the target's vocabulary [0, {vocab}): tokenize the "
                         "prompt with the target's tokenizer.")
    if attention_mask is not None:
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids has "
                             f"{tuple(input_ids.shape)}: pass the mask the tokenizer returned with these ids.")
        ends_padded = attention_mask[:, -1] == 0
        if bool(ends_padded.any()):
            raise ValueError("Right-padded input: speculative decoding needs every prompt to end at the last column. "
                             "Tokenize with padding_side='left' (tokenizer(prompts, padding=True, padding_side='left')).")
        holes = attention_mask[:, 1:] < attention_mask[:, :-1]  # a 1 followed by a 0 before the end
        if bool(holes.any()):
            raise ValueError("attention_mask has padding inside a prompt: only left padding is supported. Tokenize "
                             "with padding_side='left'.")
    if getattr(assistant, "_hf_vocabspec_candidate_generator", None) is not None and input_ids.shape[0] > 1:
        raise ValueError(SSD_BATCH_ONE.format(rows=input_ids.shape[0]))  # before anything walks the session's modules
    gen = getattr(assistant, "generation_config", None)
    if gen is not None and getattr(gen, "batched_speculation", None) is not None:
        check_batched_speculation(gen.batched_speculation)  # refused at every batch size, not only where it is read
    prompt = input_ids.shape[-1]
    for model, role in ((target, "target"), (assistant, "drafter")):
        limit = position_limit(model)
        if not limit:
            continue
        if prompt > limit:
            raise ValueError(f"The prompt has {prompt} tokens but the {role} handles at most {limit} positions: "
                             "shorten the prompt.")
        if max_length is not None and max_length > limit:
            raise ValueError(f"The prompt ({prompt} tokens) plus max_new_tokens reaches {max_length} positions but the "
                             f"{role} handles at most {limit}: shorten the prompt or lower max_new_tokens to at most "
                             f"{limit - prompt}.")


def check_attention_mask(input_ids: torch.Tensor, attention_mask) -> None:
    """The caller's attention mask, checked AS GIVEN (before transformers drops an all-ones mask or indexes a 1-D
    one): one row per prompt, the prompt's length, 0/1 values, no row without a token. Call it at the generate
    entry, before transformers touches the kwargs."""
    if attention_mask is None:
        return
    fix = "pass the mask the tokenizer returned with these ids (tokenizer(prompts, padding=True, return_tensors='pt'))"
    if not isinstance(attention_mask, torch.Tensor):
        raise ValueError(f"attention_mask is a {type(attention_mask).__name__}, not a tensor: {fix}.")
    ids_shape, shape = tuple(input_ids.shape), tuple(attention_mask.shape)
    if attention_mask.dim() == 1 and input_ids.dim() == 2:  # transformers indexes it as 2-D: IndexError, any batch
        raise ValueError(f"attention_mask is 1-D {shape} but input_ids is {ids_shape} ({ids_shape[0]} prompt(s)): pass "
                         f"one mask row per prompt, shape {ids_shape}; {fix}.")
    if attention_mask.dim() == 2 and input_ids.dim() == 2 and shape[0] != ids_shape[0]:
        raise ValueError(f"attention_mask has {shape[0]} rows but input_ids has {ids_shape[0]} prompts: {fix}.")
    if shape != ids_shape:
        raise ValueError(f"attention_mask has shape {shape} but input_ids has {ids_shape}: {fix}.")
    if attention_mask.numel() and bool(((attention_mask != 0) & (attention_mask != 1)).any()):
        raise ValueError(f"attention_mask holds values other than 0 and 1: {fix}.")
    rows = attention_mask.reshape(ids_shape[0] if input_ids.dim() == 2 else 1, -1)
    if rows.numel() and bool((rows == 0).all(-1).any()):
        row = int((rows == 0).all(-1).nonzero()[0, 0])
        raise ValueError(f"attention_mask row {row} is all zeros (a prompt with no token): drop that prompt or give "
                         "it at least one token.")


def check_generate_kwargs(generation_config, assistant_model=None) -> None:
    """Refuse two ways of drafting in one call: transformers drafts with ``assistant_model`` and drops prompt lookup
    (or early exit) without a word. Call it at the generate entry with the call's assistant_model."""
    chosen = [name for name, on in (("assistant_model=", assistant_model is not None),
                                    ("prompt_lookup_num_tokens=",
                                     getattr(generation_config, "prompt_lookup_num_tokens", None) is not None),
                                    ("assistant_early_exit=",
                                     getattr(generation_config, "assistant_early_exit", None) is not None)) if on]
    if len(chosen) > 1:
        raise ValueError(f"{' and '.join(chosen)} each choose how drafts are made and only one would run "
                         f"(transformers silently drops the others): pass one of them.")


def check_model_kwargs(model_kwargs: dict) -> None:
    """A drafter-only setting passed to generate() (``batched_speculation="off"``, ``use_context_tokens=False``, ...)
    is refused in one line naming where it is set, instead of transformers' "model_kwargs are not used"."""
    for name, value in (model_kwargs or {}).items():
        why = drafter_setting_error(name, value) if value is not None else None
        if why:
            raise ValueError(why)


# Draft length of an untrimmed assistant left at transformers' default (20, meant for its confidence-stopped,
# batch-1 schedule): the batched loop drafts this many instead.
PLAIN_ASSISTANT_DRAFT_LENGTH = 5


def _draft_length(assistant, generation_config, rows: int = 1, confidence_threshold: float = 0.0) -> int:
    """The draft length: a value passed to generate() wins over the drafter's own (HF ignores it, #40739); an
    untrimmed assistant left at transformers' default drafts PLAIN_ASSISTANT_DRAFT_LENGTH; a drafter's own L with
    a ``confidence_threshold`` is a cap that rounds of CAPPED_FROM_ROWS ``rows`` or more draw at most
    CAPPED_DRAFT_LENGTH from (the engine asks again as a batch's rows finish: ``draft_tokens_for_rows``)."""
    L = int(_assistant_setting(assistant, generation_config, "num_assistant_tokens") or PLAIN_ASSISTANT_DRAFT_LENGTH)
    if rows >= CAPPED_FROM_ROWS and _passed(generation_config, "num_assistant_tokens") is None:
        L = capped_draft_length(L, confidence_threshold)
    return L


def batchable_plain_assistant(target, assistant, bound: dict) -> bool:
    """An untrimmed assistant that shares the target's vocabulary (no tokenizer translation): at batch > 1,
    where transformers refuses assisted generation, it drafts through our loop with its full head."""
    if assistant is None or is_ours(assistant) or bound.get("assistant_tokenizer") is not None:
        return False
    config = getattr(assistant, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False) or target.config.is_encoder_decoder:
        return False
    return config.get_text_config().vocab_size == target.config.get_text_config().vocab_size


# model kwargs generate() hands the decoding method that the engine reproduces itself (the cache, the mask and the
# position ids it derives from the mask, logits_to_keep, use_cache); any other model input is refused.
_ENGINE_MODEL_KWARGS = {"attention_mask", "position_ids", "past_key_values", "cache", "use_cache", "logits_to_keep",
                        "cache_position"}


def _engine_refusal(target, assistant, input_ids, generation_config, model_kwargs, bound) -> str | None:
    """Why the engine cannot serve this call exactly (one line naming what to do), or None."""
    batch = input_ids.shape[0]
    if target.config.is_encoder_decoder:
        return "hf_vocabspec drafts for decoder-only targets: generate without assistant_model for this model."
    if generation_config.assistant_ensemble_weight is not None:
        return ("assistant_ensemble_weight makes verification lossy; hf_vocabspec only does lossless speculative "
                "decoding. Remove `assistant_ensemble_weight`.")
    if bound.get("synced_gpus"):
        return "synced_gpus=True is not supported with speculative decoding: drop it (one process per model)."
    if generation_config.guidance_scale is not None and generation_config.guidance_scale != 1:
        return ("guidance_scale (classifier-free guidance) cannot be kept exact with a drafter: generate without "
                "assistant_model, or drop guidance_scale.")
    for flag in ("output_attentions", "output_hidden_states"):
        if getattr(generation_config, flag, False):
            return f"{flag}=True is not supported with speculative decoding: drop it or generate without assistant_model."
    if batch > 1:
        for flag in ("output_scores", "output_logits"):
            if getattr(generation_config, flag, False):
                return (f"{flag}=True is supported at batch 1 with a drafter: drop it or generate one prompt at a "
                        "time.")
    extra = sorted(k for k, v in model_kwargs.items() if v is not None and k not in _ENGINE_MODEL_KWARGS)
    if extra:
        return (f"Speculative decoding with hf_vocabspec takes input_ids and attention_mask only, not {extra}: "
                "generate without assistant_model for these inputs.")
    if model_kwargs.get("use_cache") is False:
        return "Speculative decoding needs the KV cache: drop use_cache=False."
    cache = model_kwargs.get("past_key_values", model_kwargs.get("cache"))
    if cache is None or not forward_has_cache(type(target)):
        return (f"{type(target).__name__} has no KV cache that generate can prepare, so its drafts cannot be verified "
                "exactly: generate without assistant_model.")
    if getattr(cache, "_is_user_defined", False):
        return ("A prefilled or user-made past_key_values cannot be rolled back row by row: pass the whole prompt "
                "as input_ids and no past_key_values.")
    if type(cache) is StaticCache and not static_layers_supported(cache):
        layers = sorted({type(layer).__name__ for layer in cache.layers} - {"StaticLayer", "StaticSlidingWindowLayer",
                                                                             "LinearAttentionLayer", "DummyLayer"})
        return (f"cache_implementation={generation_config.cache_implementation!r} with this model's cache layers "
                f"({', '.join(layers)}) is not supported with speculative decoding: use the default dynamic cache.")
    if not (type(cache) is DynamicCache and not getattr(cache, "offloading", False)) and \
            not static_layers_supported(cache):
        return (f"cache_implementation={generation_config.cache_implementation!r} ({type(cache).__name__}) is not "
                "supported with speculative decoding: use the default dynamic cache or 'static'.")
    for model, role in ((target, "target"), (assistant, "drafter")):
        config = model.model.config if isinstance(model, TrimmedDrafter) else model.config
        bad = unsupported_layer_types(config)
        if bad:
            return (f"The {role}'s cache has {bad} layers, whose states cannot be rolled back per row: generate "
                    "without assistant_model.")
    text = target.config.get_text_config(decoder=True)
    topk = getattr(text, "index_topk", None)
    if topk and "indexed_attention" in (getattr(text, "layer_types", None) or []) and \
            generation_config.max_length > topk:
        return (f"This target's sparse attention keeps {topk} keys per query (index_topk), and it picks other keys when "
                "it verifies several positions at once than when it decodes one (transformers' own assisted loop "
                f"differs too): keep prompt + new tokens <= {topk}, or generate without assistant_model.")
    position_ids = model_kwargs.get("position_ids")
    mask = model_kwargs.get("attention_mask")
    if position_ids is not None:
        real = mask.bool() if mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
        derived = (real.long().cumsum(-1) - 1).clamp(min=0)
        if position_ids.shape != input_ids.shape or bool((position_ids != derived)[real].any()):
            return ("Custom position_ids are not supported with speculative decoding (the engine derives them from "
                    "the attention mask): drop position_ids.")
    return None


def _run_engine(target, assistant, bound: dict, kernels: str = "F.linear (not ours)", compiled: bool = False,
                compiled_draft: bool = False, compile_fallible: bool = False):
    """Every call with one of our drafters (and an untrimmed assistant at batch > 1) runs in our engine."""
    input_ids = bound["input_ids"]
    generation_config = bound["generation_config"]
    model_kwargs = dict(bound.get("model_kwargs", {}))
    if getattr(assistant, "_hf_vocabspec_candidate_generator", None) is not None:
        raise ValueError(SSD_BATCH_ONE.format(rows=input_ids.shape[0]))
    reason = _engine_refusal(target, assistant, input_ids, generation_config, model_kwargs, bound)
    if reason:
        raise ValueError(reason)
    speculation = check_batched_speculation(getattr(assistant.generation_config, "batched_speculation", "auto"))
    stopping = bound.get("stopping_criteria")
    threshold = _assistant_setting(assistant, generation_config, "assistant_confidence_threshold") or 0.0
    engine = SpeculativeEngine(
        target, assistant, input_ids, bound.get("logits_processor"), stopping, generation_config,
        attention_mask=model_kwargs.get("attention_mask"),
        target_cache=model_kwargs.get("past_key_values", model_kwargs.get("cache")),
        num_draft_tokens=_draft_length(assistant, generation_config, input_ids.shape[0], threshold),
        draft_tokens_for_rows=lambda rows: _draft_length(assistant, generation_config, rows, threshold),
        confidence_threshold=threshold,
        schedule=_assistant_setting(assistant, generation_config, "num_assistant_tokens_schedule") or "constant",
        speculation=speculation, streamer=bound.get("streamer"),
        keep_scores=bool(generation_config.return_dict_in_generate and generation_config.output_scores),
        keep_logits=bool(generation_config.return_dict_in_generate and generation_config.output_logits),
        constrain_drafts=check_constrain_drafts(
            getattr(getattr(assistant, "generation_config", None), "constrain_drafts", True)),
        target_call=target.get_compiled_call(generation_config.compile_config) if compiled else None,
        compile_options=draft_compile_options(target, generation_config, compiled, compiled_draft),
        compile_fallible=compile_fallible)
    engine.stats.kernels = kernels
    inference = runs_in_inference_mode(engine)
    with torch.inference_mode(inference):
        sequences = engine.run()
    assistant.last_speculation_stats = engine.stats
    scores, logits = tuple(engine.scores), tuple(engine.raw_logits)
    if inference:  # what the caller gets back is made outside inference mode, as target-only's is
        sequences = sequences.clone()
        scores, logits = tuple(s.clone() for s in scores), tuple(x.clone() for x in logits)
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=sequences, scores=scores or None, logits=logits or None)
    return sequences


def runs_in_inference_mode(engine: SpeculativeEngine) -> bool:
    """Whether the engine's loop runs under ``torch.inference_mode`` (else under generate's ``no_grad``): unless a
    step is compiled (its graphs are guarded on grad mode and their inputs' autograd keys) or the target's cache
    holds other layers than dynamic ones (a static cache, which transformers may keep for the next call and write
    in place: an inference tensor refuses in-place writes outside inference mode). A dynamic cache's layers grow by
    ``torch.cat`` and crop by slicing, which inference tensors allow anywhere; the drafter's cache is the engine's.

    ``drafter.use_inference_mode = False`` keeps no_grad (a caller whose own processors or criteria keep tensors made
    during the call and write them in place after it, outside inference mode).

    Why: no version counters and no autograd dispatch on each of a round's ~1,500 small ops. Measured on machine F
    (AMD EPYC Zen 2, 2 cores, 2026-12-07; scripts/bench_inference_mode.py, pair G's float32 default drafter, 8
    ShareGPT prompts x 48 tokens, interleaved): 1.60x -> 1.68x same-run target-only (itself in inference mode), a
    draft step 27.7 -> 25.7 ms; docs/results/inference-mode-machine-f-2026-12-07.md. It changes no value."""
    if not getattr(engine.step.model, "use_inference_mode", True):
        return False
    if engine.step.compiled or engine.target_call is not None:
        return False
    return all(isinstance(layer, DynamicLayer) for layer in engine.target_cache.cache.layers)


def draft_compile_options(target, generation_config=None, compiled: bool = False,
                          compiled_draft: bool = True) -> dict | None:
    """torch.compile options of the drafter's steps: the call's compile_config (or the target's default) where the
    verify is compiled too (``compiled``); for compiled draft steps alone (``compiled_draft``) the same with static
    shapes (``dynamic=False``): a round's first step feeds 1 or 2 tokens, and a graph made dynamic by the second runs
    the one-token steps slower than their own static graph. None: the drafter's steps run eager. (``tune
    --compile-draft-step`` times the steps with these options: generate then reuses what it compiled.)"""
    if not (compiled or compiled_draft):
        return None
    compile_config = getattr(generation_config, "compile_config", None)
    options = (compile_config or target._default_compile_config()).to_dict()
    if compiled_draft:
        options["dynamic"] = False
    return options


def compile_setting(assistant) -> bool | str:
    """A trimmed drafter's ``compile_draft_step`` (True, False or "auto"); False for any other assistant."""
    return getattr(assistant, "compile_draft_step", False) if isinstance(assistant, TrimmedDrafter) else False


def compiles_draft_step(assistant) -> bool:
    """Whether a trimmed drafter runs this call's draft steps compiled: its one-token forwards after the prompt
    through ``torch.compile`` on a static cache of its own (Inductor fuses what the eager step dispatches op by op),
    the target as without it. ``drafter.compile_draft_step``: True always, False never, "auto" once its eager steps
    have cost what the compiles are expected to (:mod:`.autocompile`)."""
    setting = compile_setting(assistant)
    return autocompile.record_of(assistant).compiles() if setting == autocompile.AUTO else bool(setting)


def compiled_verify(target, bound: dict) -> bool:
    """Whether target-only generate would decode this call with the target's compiled forward (transformers' own
    criteria, ``_valid_auto_compile_criteria``: a static cache on CUDA, or a ``compile_config`` that compiles on
    every device): then the engine's target forwards after the prompt use that same compiled call."""
    model_kwargs = bound.get("model_kwargs", {})
    cache = model_kwargs.get("past_key_values", model_kwargs.get("cache"))
    criteria = getattr(target, "_valid_auto_compile_criteria", None)
    return type(cache) is StaticCache and criteria is not None and bool(
        criteria(model_kwargs, bound["generation_config"]))


def processors_with_state(bound: dict) -> list[str]:
    """Names of the call's logits processors not known to be stateless (``vocabulary.is_stateless``): only our
    engine calls them as target-only does; transformers' assisted loop calls them on drafted positions."""
    return [type(p).__name__ for p in bound.get("logits_processor") or [] if not is_stateless(p)]


def _passed(generation_config, name: str):
    """A drafting setting passed to generate(): anything but transformers' default (None: not passed)."""
    passed = getattr(generation_config, name, None)
    return passed if passed is not None and passed != generation_config._get_default_generation_params().get(name) \
        else None


def _assistant_setting(assistant, generation_config, name: str):
    """A drafting setting: a value passed to generate() (anything but the library default) wins over the
    drafter's own generation_config (transformers ignores it, #40739); a trimmed drafter's config that leaves it
    unset (None, transformers 5's way of saying "the default") gets transformers' default, as HF's own loop would."""
    passed = _passed(generation_config, name)
    if passed is not None:
        return passed
    default = generation_config._get_default_generation_params().get(name)
    own = getattr(assistant.generation_config, name, None)
    if not isinstance(assistant, TrimmedDrafter):
        return None if own in (None, default) else own  # an untrimmed assistant left at transformers' defaults
    return default if own is None else own


def install() -> None:
    """Wrap transformers' private generation methods for hf_vocabspec assistants; idempotent."""
    if _ORIGINALS:
        return
    check_transformers_version()
    get_generator = GenerationMixin._get_candidate_generator
    validate = GenerationMixin._validate_generation_mode
    assisted = GenerationMixin._assisted_decoding
    prepare_inputs = GenerationMixin._prepare_model_inputs
    validate_kwargs = GenerationMixin._validate_model_kwargs
    signature = inspect.signature(assisted)

    @functools.wraps(validate_kwargs)
    def _validate_model_kwargs(self, model_kwargs):
        try:  # runs before _validate_generation_mode: the assistant is not known yet
            return validate_kwargs(self, model_kwargs)
        except ValueError:  # transformers' "model_kwargs are not used": say where a drafter setting lives instead
            check_model_kwargs(model_kwargs)
            raise

    @functools.wraps(prepare_inputs)
    def _prepare_model_inputs(self, inputs=None, bos_token_id=None, model_kwargs=None):
        given = (model_kwargs or {}).get("attention_mask")
        out = prepare_inputs(self, inputs, bos_token_id, model_kwargs)
        if _OURS_CALL.get() and out[1] == "input_ids":
            check_attention_mask(out[0], given)
        return out

    def _get_candidate_generator(self, *args, **kwargs):
        assistant = kwargs.get("assistant_model")
        factory = getattr(assistant, "_hf_vocabspec_candidate_generator", None)
        if factory is not None and not args:  # a session object builds its own generator (SSD)
            return factory(**kwargs, target_vocab_size=target_rows(self))
        if not isinstance(assistant, TrimmedDrafter):
            return get_generator(self, *args, **kwargs)
        if args:
            raise TypeError("hf_vocabspec expects transformers to call _get_candidate_generator with keywords.")
        return TrimmedCandidateGenerator(
            input_ids=kwargs["input_ids"],
            assistant_model=assistant,
            generation_config=kwargs["generation_config"],
            model_kwargs=kwargs["model_kwargs"],
            inputs_tensor=kwargs.get("inputs_tensor"),
            logits_processor=kwargs.get("logits_processor"),
            target_vocab_size=target_rows(self),
        )

    def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs, *args, **kwargs):
        assistant = (generation_mode_kwargs or {}).get("assistant_model")
        _OURS_CALL.set(is_ours(assistant))
        if is_ours(assistant):
            check_generate_kwargs(generation_config, assistant)
        drafter = trimmed_drafter_of(assistant)
        if drafter is not None:  # a trimmed drafter, or the drafter of an SSD session: the same checks
            check_trimmed_assistant(self, drafter, generation_config, generation_mode_kwargs)
            rows = target_rows(self)
            if drafter.config.vocab_size != rows:  # a padded target: our check accepted it, transformers'
                config = copy.copy(drafter.config)  # compares vocabulary sizes: show it the target's
                config.vocab_size = rows
                generation_mode_kwargs = {**generation_mode_kwargs, "assistant_model": _ConfigView(config)}
        if is_ours(assistant) and generation_config.num_return_sequences > 1:
            generation_config = copy.copy(generation_config)  # our loop serves several sequences per prompt
            generation_config.num_return_sequences = 1
        return validate(self, generation_mode, generation_config, generation_mode_kwargs, *args, **kwargs)

    @functools.wraps(assisted)
    def _assisted_decoding(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs).arguments
        assistant = bound.get("assistant_model")
        input_ids = bound["input_ids"]
        model_kwargs = dict(bound.get("model_kwargs", {}))
        stateful = processors_with_state(bound)
        if not is_ours(assistant):
            if (input_ids.shape[0] > 1 or stateful) and batchable_plain_assistant(self, assistant, bound):
                check_inputs(self, assistant, input_ids, model_kwargs.get("attention_mask"),
                             bound["generation_config"].max_length)
                return _run_engine(self, assistant, bound, compiled=compiled_verify(self, bound))
            return assisted(self, *args, **kwargs)
        check_inputs(self, assistant, input_ids, model_kwargs.get("attention_mask"),
                             bound["generation_config"].max_length)
        if getattr(assistant, "_hf_vocabspec_candidate_generator", None) is not None and input_ids.shape[0] == 1:
            if stateful:
                raise ValueError(f"SSD drafts inside transformers' loop, which calls logits processors on drafted "
                                 f"positions: {', '.join(stateful)} keep(s) state that this would corrupt. Pass the "
                                 "session's trimmed drafter (session.drafter) as assistant_model for constrained "
                                 "generation.")
            return assisted(self, *args, **kwargs)  # SSD: its candidate generator inside transformers' loop
        compiled = compiled_verify(self, bound)  # then the layers stay as compile sees them
        compiled_draft = not compiled and compiles_draft_step(assistant)  # the drafter's steps alone compiled
        auto = not compiled and compile_setting(assistant) == autocompile.AUTO
        with _verify_head.generate_kernels(self, assistant, compiled=compiled,
                                           compiled_draft=compiled_draft) as fast:  # the one kernel choice
            if _TRANSFORMERS_LOOP.get() and input_ids.shape[0] == 1 and not stateful:
                return assisted(self, *args, **kwargs)
            kernels = str(fast)
            scheme = getattr(getattr(assistant, "config", None), "weight_quantization", None)
            if scheme:
                kernels += f"; drafter {scheme} weights on {getattr(assistant, 'quantized_layers', 0)} layers"
            record = autocompile.record_of(assistant) if auto else None
            if compiled_draft:
                kernels += f"; drafter steps compiled ({record.describe() if auto else 'compile_draft_step'})"
                if auto:
                    autocompile.warn_compiling(record)
            graphs = compiled_graphs()
            out = _run_engine(self, assistant, bound, kernels=kernels, compiled=compiled,
                              compiled_draft=compiled_draft, compile_fallible=auto)
            if auto:  # what the call's steps cost, for the next call's choice
                stats = assistant.last_speculation_stats
                record.record(compiled_draft, stats.draft_seconds, stats.draft_steps,
                              compiled_graphs=compiled_graphs() != graphs,
                              failure=stats.draft_compile_failure or None)
            return out

    _get_candidate_generator.__wrapped__ = get_generator
    _validate_generation_mode.__wrapped__ = validate
    _ORIGINALS.update(_get_candidate_generator=get_generator, _validate_generation_mode=validate,
                      _assisted_decoding=assisted, _prepare_model_inputs=prepare_inputs,
                      _validate_model_kwargs=validate_kwargs)
    GenerationMixin._validate_model_kwargs = _validate_model_kwargs
    GenerationMixin._prepare_model_inputs = _prepare_model_inputs
    GenerationMixin._get_candidate_generator = _get_candidate_generator
    GenerationMixin._validate_generation_mode = _validate_generation_mode
    GenerationMixin._assisted_decoding = _assisted_decoding


def uninstall() -> None:
    """Give transformers back its own methods (a TrimmedDrafter then drafts through HF's generic path: still
    lossless at batch 1, but O(vocabulary) per drafted token)."""
    for name, original in _ORIGINALS.items():
        setattr(GenerationMixin, name, original)
    _ORIGINALS.clear()
