"""THE seam to transformers' private generation API: the only module that touches it, version guard beside it.

transformers has no public hook for a user-supplied candidate generator or verification loop, so
:func:`install` (run on ``import hf_vocabspec``; :func:`uninstall` undoes it) wraps three private methods of
``GenerationMixin``, and only acts when the assistant is ours (a :class:`TrimmedDrafter` or an hf_vocabspec
session object exposing ``_hf_vocabspec_candidate_generator``); every other call goes to the original untouched:

- ``_validate_generation_mode``: our checks first (vocabulary, tokenizer fingerprint, draft length), so a
  mismatched drafter gets our one-line fix instead of transformers' advice to use universal assisted decoding;
  ``num_return_sequences > 1`` is allowed for our drafters (the batched loop serves it).
- ``_get_candidate_generator``: batch 1 drafts through :class:`TrimmedCandidateGenerator` inside HF's loop.
- ``_assisted_decoding``: checks the inputs (ids in range, non-empty, left padding), enters the verify-time
  head, and runs batch > 1 through our loop (:mod:`.batched`); an untrimmed assistant with the target's
  vocabulary, which transformers refuses at batch > 1, also runs there (its full head drafts).

What moved in transformers and is absorbed here: the cache kwarg (``cache`` from 5.24, see
``drafter.cache_kwarg``), ``_get_candidate_generator`` called with keywords (4.57 -> 5.24).
"""

from __future__ import annotations

import copy
import functools
import inspect
import weakref

import torch
from transformers import GenerationMixin
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .. import verify_head as _verify_head
from .._versions import check, supported_range
from ..drafter import TrimmedDrafter, VocabularyMapError, check_draft_length, tokenizer_sha256
from ..rdk import drafter_kernel
from .batched import SPECULATION_MODES, BatchedSpeculation
from .candidates import TrimmedCandidateGenerator

_ORIGINALS: dict[str, object] = {}
_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> sha256, hashed once


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


def _fingerprint(tokenizer) -> str:
    try:
        cached = _FINGERPRINTS.get(tokenizer)
    except TypeError:  # not weak-referenceable: hash every call
        return tokenizer_sha256(tokenizer)
    if cached is None:
        cached = _FINGERPRINTS[tokenizer] = tokenizer_sha256(tokenizer)
    return cached


def check_trimmed_assistant(target, drafter: TrimmedDrafter, generation_config, mode_kwargs: dict) -> None:
    """OUR errors for a trimmed drafter that cannot serve this target, raised before transformers' checks (which
    would advise universal assisted decoding: the wrong fix, the drafter must share the target's tokenizer)."""
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
    if tokenizer is not None and recorded and _fingerprint(tokenizer) != recorded:
        raise VocabularyMapError(f"The tokenizer passed to generate() ({getattr(tokenizer, 'name_or_path', '')!r}) "
                                 f"is not the one this drafter was trimmed with (tokenizer fingerprints differ); {fix}")


def check_inputs(target, assistant, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 max_length: int | None = None) -> None:
    """Bad input to a speculative call fails here, in one line, before any forward pass.

    ``max_length``: the total length generate will reach (prompt + max_new_tokens), checked against each model's
    position limit (read under its architecture's name, see ``drafter.position_limit``); None checks the prompt."""
    from ..drafter import check_batched_speculation, position_limit  # here: the rest of this module is being rewritten

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


# Draft length of an untrimmed assistant left at transformers' default (20, meant for its confidence-stopped,
# batch-1 schedule): the batched loop drafts this many instead.
PLAIN_ASSISTANT_DRAFT_LENGTH = 5


def _draft_length(assistant, generation_config) -> int:
    """The draft length: a value passed to generate() wins over the drafter's own (HF ignores it, #40739)."""
    default = generation_config._get_default_generation_params().get("num_assistant_tokens")
    own = int(assistant.generation_config.num_assistant_tokens or PLAIN_ASSISTANT_DRAFT_LENGTH)
    if not isinstance(assistant, TrimmedDrafter) and own == default:
        own = PLAIN_ASSISTANT_DRAFT_LENGTH
    passed = getattr(generation_config, "num_assistant_tokens", None)
    return int(passed) if passed is not None and passed != default else own


def batchable_plain_assistant(target, assistant, bound: dict) -> bool:
    """An untrimmed assistant that shares the target's vocabulary (no tokenizer translation): at batch > 1,
    where transformers refuses assisted generation, it drafts through our loop with its full head."""
    if assistant is None or is_ours(assistant) or bound.get("assistant_tokenizer") is not None:
        return False
    config = getattr(assistant, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False) or target.config.is_encoder_decoder:
        return False
    return config.get_text_config().vocab_size == target.config.get_text_config().vocab_size


def _batched(target, input_ids, logits_processor, stopping_criteria, generation_config, assistant, streamer,
             model_kwargs):
    """Batch > 1 through our loop: refuse what it does not serve, in one line each."""
    if getattr(assistant, "_hf_vocabspec_candidate_generator", None) is not None:
        raise ValueError("SSD runs at batch 1: call generate once per prompt with the SSD session, or pass the "
                         "trimmed drafter itself as assistant_model for batched generation.")
    if streamer is not None:
        raise ValueError("Streamers support batch 1 (as in transformers): generate one prompt at a time to stream.")
    if generation_config.do_sample and getattr(assistant, "use_rdk", False) and drafter_kernel(assistant) is not None:
        raise ValueError("RDK sampling runs at batch 1: set drafter.use_rdk = False for batched generation, or "
                         "generate one prompt at a time.")
    for flag in ("output_attentions", "output_hidden_states", "output_scores", "output_logits"):
        if getattr(generation_config, flag, False):
            raise ValueError(f"{flag}=True is supported at batch 1 only with a trimmed drafter: drop it or "
                             "generate one prompt at a time.")
    speculation = getattr(assistant.generation_config, "batched_speculation", "auto")
    if speculation not in SPECULATION_MODES:
        raise ValueError(f"drafter.generation_config.batched_speculation must be one of {SPECULATION_MODES} "
                         f"(got {speculation!r}).")
    if isinstance(assistant, TrimmedDrafter):
        assistant.validate_vocab_map()
    loop = BatchedSpeculation(target, assistant, input_ids, logits_processor, stopping_criteria, generation_config,
                              model_kwargs.get("attention_mask"), _draft_length(assistant, generation_config),
                              speculation)
    sequences = loop.run()
    assistant.last_speculation_stats = loop.stats
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences


def install() -> None:
    """Wrap transformers' private generation methods for hf_vocabspec assistants; idempotent."""
    if _ORIGINALS:
        return
    check_transformers_version()
    get_generator = GenerationMixin._get_candidate_generator
    validate = GenerationMixin._validate_generation_mode
    assisted = GenerationMixin._assisted_decoding
    signature = inspect.signature(assisted)

    def _get_candidate_generator(self, *args, **kwargs):
        assistant = kwargs.get("assistant_model")
        factory = getattr(assistant, "_hf_vocabspec_candidate_generator", None)
        if factory is not None and not args:  # a session object builds its own generator (SSD)
            return factory(**kwargs, target_vocab_size=self.config.get_text_config().vocab_size)
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
            target_vocab_size=self.config.get_text_config().vocab_size,
        )

    def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs, *args, **kwargs):
        assistant = (generation_mode_kwargs or {}).get("assistant_model")
        if isinstance(assistant, TrimmedDrafter):
            check_trimmed_assistant(self, assistant, generation_config, generation_mode_kwargs)
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
        if not is_ours(assistant):
            if input_ids.shape[0] > 1 and batchable_plain_assistant(self, assistant, bound):
                check_inputs(self, assistant, input_ids, model_kwargs.get("attention_mask"))
                return _batched(self, input_ids, bound.get("logits_processor"), bound.get("stopping_criteria"),
                                bound["generation_config"], assistant, bound.get("streamer"), model_kwargs)
            return assisted(self, *args, **kwargs)
        check_inputs(self, assistant, input_ids, model_kwargs.get("attention_mask"))
        with _verify_head.verify_head(self, enabled=_verify_head.wants_verify_head(assistant)):
            if input_ids.shape[0] == 1:
                return assisted(self, *args, **kwargs)
            return _batched(self, input_ids, bound.get("logits_processor"), bound.get("stopping_criteria"),
                            bound["generation_config"], assistant, bound.get("streamer"), model_kwargs)

    _get_candidate_generator.__wrapped__ = get_generator
    _validate_generation_mode.__wrapped__ = validate
    _ORIGINALS.update(_get_candidate_generator=get_generator, _validate_generation_mode=validate,
                      _assisted_decoding=assisted)
    GenerationMixin._get_candidate_generator = _get_candidate_generator
    GenerationMixin._validate_generation_mode = _validate_generation_mode
    GenerationMixin._assisted_decoding = _assisted_decoding


def uninstall() -> None:
    """Give transformers back its own methods (a TrimmedDrafter then drafts through HF's generic path: still
    lossless at batch 1, but O(vocabulary) per drafted token)."""
    for name, original in _ORIGINALS.items():
        setattr(GenerationMixin, name, original)
    _ORIGINALS.clear()
