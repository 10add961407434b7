"""The target's logits processors for the worker, rebuilt there from the GenerationConfig: processor objects
never cross the process boundary (a processor defined in a notebook could not be rebuilt by name anyway).

The main process rebuilds the same list from the same inputs and compares it with the processors generate()
prepared; any difference (a custom ``logits_processor=``, a setting outside the rebuilt subset) names the
processor, and the session runs that call synchronously in this process instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessorList
from transformers.generation import logits_process as lp


@dataclass(frozen=True)
class PromptFacts:
    """What the processors need from the call besides the config: the prompt length, and the left padding per
    row (``attention_mask`` argmax, as generate() computes it for the repetition penalty; None without a mask)."""

    length: int
    padding: tuple[int, ...] | None = None

    @classmethod
    def of(cls, input_ids: torch.Tensor, model_kwargs: dict | None) -> PromptFacts:
        mask = (model_kwargs or {}).get("attention_mask")
        padding = None if mask is None else tuple((mask != 0).int().argmax(dim=1).tolist())
        return cls(int(input_ids.shape[-1]), padding)


def config_to_dict(generation_config: GenerationConfig) -> dict:
    """The public fields of a GenerationConfig as plain JSON values (raises TypeError when one is not)."""
    d = {k: v for k, v in generation_config.to_dict().items() if not k.startswith("_")}
    return json.loads(json.dumps(d))


def config_from_dict(d: dict) -> GenerationConfig:
    """The worker's copy of the call's GenerationConfig."""
    return GenerationConfig.from_dict(d)


def _eos(gc: GenerationConfig, device) -> torch.Tensor | None:
    return None if gc.eos_token_id is None else torch.tensor(gc.eos_token_id, device=device).flatten()


def processors_from_config(gc: GenerationConfig, prompt: PromptFacts, device="cpu") -> LogitsProcessorList:
    """The processors generate() builds for these settings, in its order, for the subset SSD's worker supports
    (repetition penalty, min length, min new tokens, the sampling warpers, renormalisation)."""
    procs = LogitsProcessorList()
    eos = _eos(gc, device)
    if gc.repetition_penalty is not None and gc.repetition_penalty != 1.0:
        padding = None if prompt.padding is None else torch.tensor(prompt.padding, device=device)
        procs.append(lp.RepetitionPenaltyLogitsProcessor(gc.repetition_penalty, prompt_ignore_length=padding))
    if gc.min_length is not None and eos is not None and gc.min_length > 0:
        procs.append(lp.MinLengthLogitsProcessor(gc.min_length, eos, device=device))
    if gc.min_new_tokens is not None and eos is not None and gc.min_new_tokens > 0:
        procs.append(lp.MinNewTokensLengthLogitsProcessor(prompt.length, gc.min_new_tokens, eos, device=device))
    if gc.do_sample:
        if gc.temperature is not None and gc.temperature != 1.0:
            procs.append(lp.TemperatureLogitsWarper(gc.temperature))
        if getattr(gc, "top_h", None) is not None:
            procs.append(lp.TopHLogitsWarper(top_h=gc.top_h))
        if gc.top_k is not None and gc.top_k != 0:
            procs.append(lp.TopKLogitsWarper(top_k=gc.top_k, min_tokens_to_keep=1))
        if gc.top_p is not None and gc.top_p < 1.0:
            procs.append(lp.TopPLogitsWarper(top_p=gc.top_p, min_tokens_to_keep=1))
        if gc.min_p is not None:
            procs.append(lp.MinPLogitsWarper(min_p=gc.min_p, min_tokens_to_keep=1))
        if gc.typical_p is not None and gc.typical_p < 1.0:
            procs.append(lp.TypicalLogitsWarper(mass=gc.typical_p, min_tokens_to_keep=1))
        if gc.epsilon_cutoff is not None and 0.0 < gc.epsilon_cutoff < 1.0:
            procs.append(lp.EpsilonLogitsWarper(epsilon=gc.epsilon_cutoff, min_tokens_to_keep=1))
        if gc.eta_cutoff is not None and 0.0 < gc.eta_cutoff < 1.0:
            procs.append(lp.EtaLogitsWarper(epsilon=gc.eta_cutoff, min_tokens_to_keep=1, device=device))
    if gc.renormalize_logits is True:
        procs.append(lp.LogitNormalization())
    return procs


def _state(proc) -> tuple:
    return type(proc), {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in vars(proc).items()}


def unrebuildable(logits_processor, generation_config: GenerationConfig, prompt: PromptFacts) -> str | None:
    """Why the worker could not rebuild ``logits_processor`` from the config (None when it can)."""
    try:
        gc = config_from_dict(config_to_dict(generation_config))
    except (TypeError, ValueError) as err:
        return f"its generation config does not travel as JSON ({err})"
    given = list(logits_processor or [])
    rebuilt = list(processors_from_config(gc, prompt))
    for i in range(max(len(given), len(rebuilt))):
        if i >= len(given):
            return f"the worker would add a {type(rebuilt[i]).__name__} generate() did not build"
        if i >= len(rebuilt) or _state(given[i]) != _state(rebuilt[i]):
            return (f"the logits processor {type(given[i]).__name__} is not one the worker rebuilds from the "
                    "GenerationConfig")
    return None
