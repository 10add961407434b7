"""Generation with hf_vocabspec drafters: ``target.generate(**inputs, assistant_model=drafter)``.

- :mod:`.hooks` — the one seam to transformers' private generation API (installed on import).
- :mod:`.engine` — the speculative engine: our own verification loop, at every batch size.
- :mod:`.draft_step` — THE draft step every drafting loop uses (and the draft-space logits processors).
- :mod:`.candidates` — the candidate generator inside transformers' loop (SSD sessions build on it).
- :mod:`.vocabulary` — the draft space (kept rows + context tokens).
- :mod:`.stats` — :class:`SpeculationStats`, what a call did.
"""

from __future__ import annotations

from .candidates import TrimmedCandidateGenerator
from .hooks import install, uninstall
from .stats import SpeculationStats
from .draft_step import DraftStep, draft_space_processors
from .vocabulary import _VALUE_ONLY, DraftVocabulary, is_value_only  # noqa: F401

__all__ = ["DraftStep", "DraftVocabulary", "SpeculationStats", "TrimmedCandidateGenerator", "draft_space_processors", "install",
           "uninstall"]

install()
