"""What a trimmed drafter saves: its config (config.json) and its drafting settings (generation_config.json).

:class:`TrimmedDrafterConfig` declares every field of a drafter's config.json with its type and meaning; the
free-form entries have typed shapes (:class:`RDKInfo`, :class:`SelectionInfo`, :class:`EvalResultRow`), which
are plain dicts at run time, so config.json round-trips unchanged and checkpoints saved before the shapes were
declared load as they are. The drafting settings a drafter carries in its generation_config (draft length,
confidence threshold, the batched loop's rule) have their defaults, valid values and checks here too.

Runtime switches are not a second copy of these fields: ``drafter.use_context_tokens``, ``drafter.use_verify_head``,
``drafter.compile_draft_step`` and ``drafter.use_rdk`` read and write ``config.context_tokens``, ``config.verify_head``,
``config.compile_draft_step`` and ``config.rdk["enabled"]``
(see :class:`~hf_vocabspec.modeling.TrimmedDrafter`), so what a call uses and what a save writes are one value.

Shipped with every checkpoint (beside modeling.py, as ``trust_remote_code`` code): imports only the standard library,
torch and transformers.
"""

from __future__ import annotations

from typing import Any, TypedDict

from transformers import AutoConfig, GenerationConfig, PreTrainedConfig

__all__ = [
    "CAPPED_DRAFT_LENGTH",
    "CAPPED_FROM_ROWS",
    "DEFAULT_CONFIDENCE_THRESHOLD",
    "DEFAULT_NUM_ASSISTANT_TOKENS",
    "MODEL_TYPE",
    "SPECULATION_MODES",
    "EvalResultRow",
    "RDKInfo",
    "SelectionInfo",
    "TrimmedDrafterConfig",
    "VocabularyMapError",
    "check_batched_speculation",
    "check_confidence_threshold",
    "check_constrain_drafts",
    "capped_draft_length",
    "check_draft_length",
    "check_drafting_settings",
    "check_switch",
    "check_weight_quantization",
    "DRAFTER_SETTINGS",
    "drafter_setting_error",
    "set_draft_length",
    "WEIGHT_QUANTIZATIONS",
]

MODEL_TYPE = "hf_vocabspec_trimmed_drafter"

# Defaults written into a freshly trimmed drafter's generation_config (users may change them; a value
# passed to `target.generate(num_assistant_tokens=...)` wins, see generation/hooks.py): draft up to 12 tokens a
# round, stopping after a draft the drafter gives less than 0.4 (transformers' own assistant_confidence_threshold).
# Measured against L = 5 without a stop (issue #36, machine D, 2026-11-28, greedy, same-kernel target-only): pair Q
# ShareGPT 0.89x -> 1.05x, HumanEval 1.88x -> 2.17x; pair G 1.36x -> 1.42x, 1.34x -> 1.44x
# (docs/results/default-draft-policy-machine-d-2026-11-28.md).
# The threshold is where a call starts: rounds of one row on a CPU adapt it (generation/confidence.py).
DEFAULT_NUM_ASSISTANT_TOKENS = 12
DEFAULT_CONFIDENCE_THRESHOLD = 0.4
# Where a confidence stop cannot end the drafting early, the drafter's L is only a cap: SSD's trees (no stop) and
# rounds of CAPPED_FROM_ROWS rows or more (the batch drafts on while any row is sure) draft at most this many, unless
# generate() is given num_assistant_tokens (pair G at batch 4, machine D, 2026-11-28: L = 12 with the stop 1.11x,
# L = 5 1.27x same-kernel batched target-only). Rounds of one or two rows draft the drafter's L with its stop: pair G
# at batch 2 on machine F (AMD EPYC Zen 2, 2026-12-07, scripts/bench_draft_cap.py: 8 ShareGPT prompts in batches of
# 2, two passes) ran 1.70x same-kernel batched target-only uncapped against 1.58x with the cap of 5 (1.64 / 1.77x
# against 1.50 / 1.66x per pass; 7.6 against 3.9 tokens accepted a row and round); at batch 3 uncapped was within a
# pass's spread (1.35x against 1.32x), at batch 4 even (docs/results/few-rows-uncapped-machine-f-2026-12-07.md).
CAPPED_DRAFT_LENGTH = 5
CAPPED_FROM_ROWS = 3


def capped_draft_length(num_draft_tokens: int, confidence_threshold: float) -> int:
    """The draft length where a confidence stop cannot end the drafting (see CAPPED_DRAFT_LENGTH)."""
    return min(int(num_draft_tokens), CAPPED_DRAFT_LENGTH) if confidence_threshold else int(num_draft_tokens)
# Values of a drafter's ``generation_config.batched_speculation`` (the batched loop's fallback rule; the one home of
# the valid values): "auto" decides from measured rounds, "on"/"off" force speculation / plain decoding.
SPECULATION_MODES = ("auto", "on", "off")
# Values of ``config.weight_quantization`` (the one home of the valid values): the drafter's linear layers run
# weight-only int8 (one scale per output row) or int4 (asymmetric, groups of 128, 64 or 32 inputs) kernels.
WEIGHT_QUANTIZATIONS = ("int8", "int4")


class VocabularyMapError(ValueError):
    """The draft-id -> target-id map is missing, corrupt, or does not fit the model it is used with."""


# --- typed shapes of config.json's structured entries (plain dicts at run time) ----------------------------------
# (required keys in a total base class, optional ones in a total=False subclass: typing.Required is Python 3.11+)
class _RDKRequired(TypedDict):
    num_targets: int
    """Pruned target ids each kept row may move probability mass to (the buffers' second dimension)."""


class RDKInfo(_RDKRequired, total=False):
    """``config.rdk``: the attached RDK kernel (out-of-vocabulary sampling, see hf_vocabspec.rdk); None = no kernel.

    The kernel's own fit record (``kernel.info``: objective, shrink, temperature, held-out scores, ...) rides along
    under further keys."""

    method: str
    """How the kernel was built: "fitted" (on the target's distributions) or "prior" (embedding similarity)."""
    enabled: bool
    """Whether sampling uses the kernel; the runtime switch ``drafter.use_rdk`` is this value."""
    moved_mass: float
    """Mean probability mass the kernel moves from kept rows to pruned ids."""


class SelectionInfo(TypedDict, total=False):
    """``config.selection``: how the kept vocabulary was chosen (written by select/trim/tune/demo; shown on the card).

    Every key is optional; a producer may add its own (they ride along and show in the card's table)."""

    method: str
    """The selection procedure, e.g. "top-k by assistant-token count"."""
    k: int
    """Kept size asked for (the drafter's ``draft_vocab_size`` adds the always-kept special tokens)."""
    coverage: float
    """Share of the counted assistant tokens the kept vocabulary covers."""
    held_out_coverage: float
    """The same share on held-out counts."""
    min_coverage: float | None
    """The coverage floor the selection had to meet (None for a fixed k)."""
    objective: str
    """What the selection optimised ("fixed k", "utility", ...)."""
    value: float
    """The objective's value at the chosen k."""
    cost_source: str | None
    """Where the draft cost came from (measured latency curve, FLOP model)."""
    dataset: str | None
    """The data the tokens were counted on."""
    count_examples: int
    """Conversations counted."""
    mode: str
    """Tune's decoding mode ("greedy", "t1", ...)."""
    num_draft_tokens: int
    """Tune's chosen draft length L."""
    confidence_threshold: float
    """Tune's chosen confidence threshold (0: none)."""
    context_tokens: bool
    """Tune's choice of context tokens."""
    predicted_speedup: float
    """Predicted speedup over target-only decoding at the chosen setting."""
    predicted_tokens_per_s: float
    """Predicted tokens per second at the chosen setting."""
    pareto: list[dict[str, Any]]
    """Pareto front of the selection: ``[{"k", "coverage", "relative_cost"}]`` (the card's table)."""


class _EvalResultRequired(TypedDict):
    metric_type: str
    """e.g. "acceptance_rate", "speedup_vs_hf_assisted"."""
    metric_value: float
    """The measured value."""
    dataset_name: str
    """The data it was measured on, e.g. "offline:sharegpt (held-out)"."""


class EvalResultRow(_EvalResultRequired, total=False):
    """One row of ``config.eval_results``: a measured number for the model card's model-index."""

    metric_name: str
    """Display name (default: metric_type)."""
    dataset_type: str
    """Hub dataset id (default: derived from dataset_name)."""
    task_type: str
    """Default "text-generation"."""
    source_name: str
    """Who measured it (with source_url)."""
    source_url: str
    """Where the measurement is described."""


class TrimmedDrafterConfig(PreTrainedConfig):
    """Config of a :class:`~hf_vocabspec.modeling.TrimmedDrafter`: every field it saves to config.json."""

    model_type = MODEL_TYPE

    drafter_config: dict[str, Any] | None = None
    """The wrapped body's own config (its ``to_dict()``), so any architecture round-trips."""
    vocab_size: int = 0
    """The FULL (target) vocabulary the drafter reads and proposes in: the ids ``d2t`` maps into."""
    draft_vocab_size: int = 0
    """The number of LM-head rows kept (the kept size k, special tokens included)."""
    vocab_map_sha256: str | None = None
    """SHA-256 of the ``d2t`` map: a checkpoint whose map is missing or corrupt is refused at load time."""
    target_model: str | None = None
    """The target the drafter was trimmed for (a name or path; informational)."""
    target_tokenizer_sha256: str | None = None
    """Fingerprint of the tokenizer the drafter was trimmed with (hf_vocabspec.compatibility.tokenizer_sha256)."""
    base_drafter: str | None = None
    """The untrimmed model the drafter was cut from."""
    selection: SelectionInfo | None = None
    """How the kept vocabulary was chosen (:class:`SelectionInfo`)."""
    eval_results: list[EvalResultRow] | None = None
    """Measured numbers for the model card (:class:`EvalResultRow`); None: none recorded."""
    rdk: RDKInfo | None = None
    """The attached RDK kernel (:class:`RDKInfo`); None = no kernel."""
    context_tokens: bool = False
    """Draft pruned tokens that already occur in the context (see generation.DraftVocabulary). The runtime switch
    ``drafter.use_context_tokens`` reads and writes this field. trim_drafter turns it on wherever the pruned rows
    stay reachable; checkpoints saved without the field keep it off."""
    max_context_tokens: int = 2048
    """At most this many context tokens are added to the draft vocabulary per generate call."""
    context_head_size: int = 0
    """Pruned LM-head rows kept for context tokens when the base's head is NOT tied to its input embedding (buffers
    ``context_head`` (C, hidden) and ``context_ids`` (C,), ascending target ids); 0 = none kept."""
    verify_head: bool = True
    """Verify with hf_vocabspec.verify_head (the target's LM head reading its weight once for the L+1 rows). The
    runtime switch ``drafter.use_verify_head`` reads and writes this field."""
    compile_draft_step: bool | str = False
    """Run the drafter's one-token steps compiled (``torch.compile`` on a static cache of its own): Inductor fuses what
    the eager step dispatches op by op; the call that compiles pays the compiles, later ones reuse them. True: from the
    first call; "auto": once its eager steps have cost what the compiles are expected to, kept only where measured
    faster (``generation.autocompile``); False (a new trim's): never. The runtime switch
    ``drafter.compile_draft_step`` reads and writes this field (``tune --compile-draft-step`` saves it on where it
    timed the steps that way, off where it timed them eager); checkpoints saved without the field keep it off."""
    weight_quantization: str | None = None
    """None, or one of ``WEIGHT_QUANTIZATIONS``: the drafter's linear layers (body and kept head) hold weight-only
    quantized values and draft through torch's int kernels (CPU; their copies made at load), cutting the bytes a
    draft step reads. Only the drafter's proposals change (acceptance); the output stays the target's. Set with
    ``drafter.quantize_weights(...)``."""
    tie_word_embeddings: bool = False
    """The drafter's own head is never tied (its kept rows are a copy); the body's tying is in drafter_config."""

    def body_config(self) -> PreTrainedConfig:
        """The wrapped body's config object (built from ``drafter_config``)."""
        if not self.drafter_config:
            raise VocabularyMapError(
                "This TrimmedDrafter config has no `drafter_config` (the wrapped model's config). "
                "Re-create the drafter with `hf_vocabspec.trim_drafter(base_model, keep_token_ids)`."
            )
        cfg = dict(self.drafter_config)
        for key in ("dtype", "torch_dtype"):  # the body follows the drafter's dtype (from_pretrained(dtype=...)),
            cfg.pop(key, None)  # not the dtype its base was saved in (else only the head is converted)
        return AutoConfig.for_model(cfg.pop("model_type"), **cfg)


def check_switch(name: str, value: object, fix: str) -> bool:
    """Refuse an on/off setting ``name`` that is not True or False (an edited config file, a typo'd switch), in one
    line ending with ``fix``."""
    if isinstance(value, bool):
        return value
    raise ValueError(f"{name} must be True or False (got {value!r}): {fix}.")


def check_compile_draft_step(value: object, fix: str) -> bool | str:
    """``compile_draft_step``: True, False or "auto" (``generation.autocompile``); anything else refused in one line
    ending with ``fix``."""
    if isinstance(value, bool) or value == "auto":
        return value
    raise ValueError(f"compile_draft_step must be True, False or \"auto\" (got {value!r}): {fix}.")


def check_weight_quantization(value: object) -> str | None:
    """Refuse a weight quantization that is not None or one of ``WEIGHT_QUANTIZATIONS``."""
    if value is None or value in WEIGHT_QUANTIZATIONS:
        return value
    raise ValueError(f"weight_quantization must be None or one of {WEIGHT_QUANTIZATIONS}, got {value!r}: "
                     f"drafter.quantize_weights(None) keeps full precision.")


# --- the drafting settings of a drafter's generation_config ---------------------------------------------------------
def check_draft_length(num_assistant_tokens: object, *, name: str = "num_assistant_tokens") -> None:
    """Refuse a draft length that is not a positive integer (the drafter drafts that many tokens per round);
    ``name`` says where the value was set (e.g. ``drafter.generation_config.num_assistant_tokens``)."""
    n = num_assistant_tokens
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be a positive integer (got {n!r}): the drafter drafts that many tokens per "
                         "round (e.g. 5).")


def check_confidence_threshold(value: object, *, name: str = "confidence_threshold") -> float:
    """Refuse a confidence threshold outside [0, 1); return it as a float. ``name`` says where it was set.

    A round stops drafting after a draft the drafter gives less probability than the threshold. 0 never stops early
    (transformers reads 0 as "off" too). transformers itself accepts any number, but a threshold of 1 or more stops
    every round after its first draft (only a probability of exactly 1 reaches it): the draft length would be 1
    whatever ``num_assistant_tokens`` says, so it is refused rather than run as something else than asked for."""
    try:
        threshold = float(value)
    except (TypeError, ValueError):
        threshold = float("nan")
    if not 0.0 <= threshold < 1.0:
        raise ValueError(f"{name} must be in [0, 1) (0: no early stop; 1 or more would stop every round after one "
                         f"draft); got {value!r}.")
    return threshold


def check_batched_speculation(value: object, *,
                              fix: str = "set drafter.generation_config.batched_speculation to one of them") -> str:
    """Refuse a batched-speculation rule outside SPECULATION_MODES (at every batch size, on load and on save: a value
    only read at batch > 1 would otherwise ride along unnoticed); return it."""
    if not isinstance(value, str) or value not in SPECULATION_MODES:
        raise ValueError(f"batched_speculation must be one of {SPECULATION_MODES} (got {value!r}): {fix}.")
    return value


def check_drafting_settings(config, where: str = "{}") -> None:
    """The draft length and confidence threshold of a generation config, checked where they are set (``where``
    formats each name, e.g. "drafter.generation_config.{}"); unset values pass."""
    n = getattr(config, "num_assistant_tokens", None)
    if n is not None:
        check_draft_length(n, name=where.format("num_assistant_tokens"))
    threshold = getattr(config, "assistant_confidence_threshold", None)
    if threshold is not None:
        check_confidence_threshold(threshold, name=where.format("assistant_confidence_threshold"))


def check_constrain_drafts(value: object) -> bool:
    """``drafter.generation_config.constrain_drafts``: True or False (whether a grammar among the call's processors
    also guides the drafts, through the drafter's own copy of it)."""
    return check_switch("constrain_drafts", value, "set drafter.generation_config.constrain_drafts = True or False")


# Drafter-only settings: where each lives (what generate() refuses to take, since transformers would only call it an
# unused model kwarg). The drafting settings transformers knows (num_assistant_tokens, ...) are not here: generate()
# takes those.
DRAFTER_SETTINGS = {
    "batched_speculation": "drafter.generation_config.batched_speculation",
    "use_context_tokens": "drafter.use_context_tokens",
    "use_verify_head": "drafter.use_verify_head",
    "use_rdk": "drafter.use_rdk",
    "use_fast_linears": "drafter.use_fast_linears",
    "use_int8_copies": "drafter.use_int8_copies",
    "use_fused_norms": "drafter.use_fused_norms",
    "use_fast_prefill": "drafter.use_fast_prefill",
    "use_lean_forward": "drafter.use_lean_forward",
    "use_inference_mode": "drafter.use_inference_mode",
    "adapt_confidence_threshold": "drafter.adapt_confidence_threshold",
    "share_prompt_cache": "drafter.share_prompt_cache",
    "compile_draft_step": "drafter.compile_draft_step",
    "weight_quantization": "drafter.quantize_weights",
}


def drafter_setting_error(name: str, value: object) -> str | None:
    """The one line for a drafter-only setting passed to generate(): where it is set instead (None: not one)."""
    where = DRAFTER_SETTINGS.get(name)
    if where is None:
        return None
    how = f"call {where}({value!r})" if name == "weight_quantization" else f"set {where} = {value!r}"
    return f"{name} is a drafter setting, not a generate() argument: {how} before generate()."


def set_draft_length(generation_config: GenerationConfig, num_assistant_tokens: int,
                     confidence_threshold: float = 0.0) -> GenerationConfig:
    """Draft ``num_assistant_tokens`` tokens every round (constant schedule); with ``confidence_threshold`` > 0,
    stop a round's drafting early after a draft the drafter gives less probability than that (transformers'
    ``assistant_confidence_threshold``, greedy or sampled; 0: always the full L).

    The one place an assistant's drafting schedule is set (trimmed drafters and HF-assisted baselines alike),
    so methods compared side by side draft the same way.
    """
    check_draft_length(num_assistant_tokens)
    threshold = check_confidence_threshold(confidence_threshold)
    generation_config.num_assistant_tokens = num_assistant_tokens
    generation_config.num_assistant_tokens_schedule = "constant"
    generation_config.assistant_confidence_threshold = threshold
    return generation_config


AutoConfig.register(MODEL_TYPE, TrimmedDrafterConfig, exist_ok=True)
# Ship the code with every checkpoint (auto_map + configuration.py), so `trust_remote_code=True` loads a drafter
# where hf_vocabspec is not installed.
TrimmedDrafterConfig.register_for_auto_class()
