"""hf_vocabspec: faster speculative decoding in Transformers by trimming the drafter's vocabulary, losslessly.

    import hf_vocabspec
    drafter = hf_vocabspec.trim_drafter(draft_model, keep_token_ids, tokenizer=tok)
    out = target.generate(**inputs, assistant_model=drafter)

Importing the package registers :class:`TrimmedDrafter` with the Auto classes and routes
``assistant_model=<TrimmedDrafter>`` to the trimmed-vocabulary candidate generator.
"""

from .drafter import (
    TrimmedDrafter,
    TrimmedDrafterConfig,
    VocabularyMapError,
    special_token_ids,
    tokenizer_sha256,
    trim_drafter,
)
from .generation import SpeculationStats, TrimmedCandidateGenerator

__version__ = "0.1.0"

__all__ = [
    "SpeculationStats",
    "TrimmedCandidateGenerator",
    "TrimmedDrafter",
    "TrimmedDrafterConfig",
    "VocabularyMapError",
    "special_token_ids",
    "tokenizer_sha256",
    "trim_drafter",
]
