"""Generation with hf_vocabspec drafters: ``target.generate(**inputs, assistant_model=drafter)``.

- :mod:`.hooks` — the one seam to transformers' private generation API (installed on import).
- :mod:`.candidates` — batch 1: the trimmed candidate generator inside transformers' verification loop.
- :mod:`.batched` — batch > 1 and ``num_return_sequences`` > 1: our own verification loop.
- :mod:`.vocabulary` — the draft space (kept rows + context tokens) and draft-space logits processors.
- :mod:`.stats` — :class:`SpeculationStats`, what a call did.
"""

from __future__ import annotations

from .candidates import TrimmedCandidateGenerator
from .hooks import install, uninstall
from .stats import SpeculationStats
from .vocabulary import _VALUE_ONLY, DraftVocabulary, draft_space_processors, is_value_only  # noqa: F401

__all__ = ["DraftVocabulary", "SpeculationStats", "TrimmedCandidateGenerator", "draft_space_processors", "install",
           "uninstall"]

install()
