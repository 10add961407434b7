"""hf_vocabspec: faster speculative decoding in Transformers by trimming the drafter's vocabulary, losslessly.

    import hf_vocabspec
    counts = hf_vocabspec.count_assistant_tokens(dataset, tok)
    drafter = hf_vocabspec.trim_drafter(draft_model, counts.top_k(counts.smallest_k_for_coverage(0.95)), tokenizer=tok)
    out = target.generate(**inputs, assistant_model=drafter)

Importing the package registers :class:`TrimmedDrafter` with the Auto classes and routes
``assistant_model=<TrimmedDrafter>`` to the trimmed-vocabulary candidate generator. The rest of the pipeline
(counting, selection, cost, Hub, export) is handed out lazily (PEP 562 ``__getattr__``) so that
``import hf_vocabspec`` does not pay for optuna, matplotlib or the Hub client until they are used.
"""

from __future__ import annotations

import importlib

from .drafter import (
    TrimmedDrafter,
    TrimmedDrafterConfig,
    VocabularyMapError,
    set_draft_length,
    special_token_ids,
    tokenizer_sha256,
    trim_drafter,
)
from .generation import SpeculationStats, TrimmedCandidateGenerator

__version__ = "0.1.0"

# public name -> module that defines it (imported on first access)
_LAZY = {
    "TokenCounts": "coverage",
    "count_assistant_tokens": "coverage",
    "count_assistant_tokens_distributed": "coverage",
    "SelectionResult": "selection",
    "select_vocabulary": "selection",
    "LatencyCurve": "cost",
    "measure_draft_latency": "cost",
    "draft_flops": "cost",
    "expected_accepted_length": "cost",
    "speculative_speedup": "cost",
    "load_drafter": "hub",
    "push_drafter_to_hub": "hub",
    "build_model_card": "hub",
    "check_drafter_compatibility": "hub",
    "DrafterMismatchError": "hub",
    "DrafterNotFoundError": "hub",
    "NotATrimmedDrafterError": "hub",
    "DrafterFileMissingError": "hub",
    "save_sglang_token_map": "export",
    "save_eagle3_vocab_map": "export",
}
# submodules reachable as attributes without importing them first (``hf_vocabspec.coverage.TokenCounts``)
# (core modules only: the tooling, hf_vocabspec.evaluation and hf_vocabspec.cli, is imported by name)
_SUBMODULES = {"coverage", "selection", "cost", "hub", "export", "rdk", "ssd", "verify_head", "drafter",
               "generation"}

__all__ = [
    "DrafterFileMissingError",
    "DrafterMismatchError",
    "DrafterNotFoundError",
    "LatencyCurve",
    "NotATrimmedDrafterError",
    "SelectionResult",
    "SpeculationStats",
    "TokenCounts",
    "TrimmedCandidateGenerator",
    "TrimmedDrafter",
    "TrimmedDrafterConfig",
    "VocabularyMapError",
    "build_model_card",
    "check_drafter_compatibility",
    "count_assistant_tokens",
    "count_assistant_tokens_distributed",
    "draft_flops",
    "expected_accepted_length",
    "load_drafter",
    "measure_draft_latency",
    "push_drafter_to_hub",
    "save_eagle3_vocab_map",
    "save_sglang_token_map",
    "select_vocabulary",
    "set_draft_length",
    "special_token_ids",
    "speculative_speedup",
    "tokenizer_sha256",
    "trim_drafter",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)
