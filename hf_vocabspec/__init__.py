"""hf_vocabspec: faster speculative decoding in Transformers by trimming the drafter's vocabulary, losslessly.

    import hf_vocabspec
    counts = hf_vocabspec.count_assistant_tokens(dataset, tok)
    drafter = hf_vocabspec.trim_drafter(draft_model, counts.top_k(counts.smallest_k_for_coverage(0.95)), tokenizer=tok)
    out = target.generate(**inputs, assistant_model=drafter)

Importing the package registers :class:`TrimmedDrafter` with the Auto classes and routes
``assistant_model=<TrimmedDrafter>`` to the trimmed-vocabulary candidate generator.

The top level holds what the README uses, nothing more; the rest lives in its submodule (reachable as an
attribute without importing it first): ``coverage`` (counting), ``selection`` (choosing k; the tuning model
``ThroughputModel`` / ``tune``), ``cost`` (draft FLOPs, measured latency, and the one round model: ``RoundModel``,
tau as ``tokens_per_round``), ``configuration``
(the saved config and drafting settings), ``modeling`` (the ``TrimmedDrafter`` model, shipped with checkpoints),
``trimming`` (``trim_drafter``), ``compatibility`` (does a drafter fit a target and tokenizer), ``generation``
(``SpeculationStats``, the candidate generator), ``hub`` (cards, errors), ``export`` (SGLang / EAGLE-3 maps),
``rdk``, ``ssd``, ``verify_head``, ``kernels`` (the fast linears). The tooling is imported by name: ``hf_vocabspec.evaluation``
(offline models and data, benchmarks, tune, distill) and ``hf_vocabspec.cli``. Names other than the drafter's
are handed out lazily (PEP 562 ``__getattr__``), so ``import hf_vocabspec`` does not pay for optuna, matplotlib
or the Hub client until they are used. The one exception to "importing installs the hooks": the ``hf-vocabspec``
command itself (``_started_as_the_command``), whose ``main`` installs them once its command line is parsed.
"""

from __future__ import annotations

import importlib
import os
import sys

__version__ = "0.1.0"


def _started_as_the_command() -> bool:
    """Whether this process is the ``hf-vocabspec`` command: its console script, or ``python -m hf_vocabspec.cli``
    (``accelerate launch -m hf_vocabspec.cli`` too). Then ``hf_vocabspec.cli.main`` imports the core, torch and
    transformers (and installs the hooks) after argparse, so ``--help`` and a bad command line answer at once."""
    if not sys.argv:
        return False
    name = os.path.basename(sys.argv[0]).lower().removesuffix(".exe").removesuffix("-script.py")
    if name == "hf-vocabspec":
        return True
    argv = list(getattr(sys, "orig_argv", ()))  # -m: argv[0] is "-m" while the package of the module is imported
    return sys.argv[0] == "-m" and any(a == "-m" and b == "hf_vocabspec.cli" for a, b in zip(argv, argv[1:]))


if not _started_as_the_command():  # every other importer: the hooks are installed now (the names below served eagerly)
    from . import generation  # noqa: F401  (importing it routes assistant_model=<TrimmedDrafter> to our generator)
    from .compatibility import DrafterMismatchError, check_compatibility, tokenizer_sha256
    from .configuration import TrimmedDrafterConfig, VocabularyMapError
    from .modeling import TrimmedDrafter
    from .trimming import trim_drafter

# public name -> module that defines it (imported on first access)
_LAZY = {
    "DrafterMismatchError": "compatibility",
    "check_compatibility": "compatibility",
    "tokenizer_sha256": "compatibility",
    "TrimmedDrafterConfig": "configuration",
    "VocabularyMapError": "configuration",
    "TrimmedDrafter": "modeling",
    "trim_drafter": "trimming",
    "TokenCounts": "coverage",
    "count_assistant_tokens": "coverage",
    "load_drafter": "hub",
    "push_drafter_to_hub": "hub",
    "SSDConfig": "ssd",
    "fit_rdk_kernel": "rdk",
}
# submodules reachable as attributes without importing them first (``hf_vocabspec.coverage.TokenCounts``);
# core modules only: the tooling (hf_vocabspec.evaluation, hf_vocabspec.cli) is imported by name
_SUBMODULES = {"coverage", "selection", "cost", "hub", "export", "rdk", "ssd", "verify_head", "kernels", "configuration",
               "modeling", "trimming", "compatibility", "generation"}

__all__ = [
    "DrafterMismatchError",
    "SSDConfig",
    "TokenCounts",
    "TrimmedDrafter",
    "TrimmedDrafterConfig",
    "VocabularyMapError",
    "check_compatibility",
    "count_assistant_tokens",
    "fit_rdk_kernel",
    "load_drafter",
    "push_drafter_to_hub",
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
