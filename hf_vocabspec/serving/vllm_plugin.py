"""The ``vllm.general_plugins`` entry point: vLLM calls :func:`register` in every one of its processes.

It registers the drafter's architecture name (``TrimmedDrafter``, what ``save_pretrained`` writes into config.json's
``architectures``) with vLLM's ``ModelRegistry`` (lazily, by name: the model module is imported where vLLM builds
the model), and our ``model_type`` with vLLM's config registry so vLLM reads config.json through
:class:`~hf_vocabspec.serving.vllm_config.VLLMTrimmedDrafterConfig`. Safe to call any number of times.
"""

from __future__ import annotations

__all__ = ["ARCHITECTURE", "register"]

ARCHITECTURE = "TrimmedDrafter"  # TrimmedDrafter.__name__, the `architectures` entry of a saved drafter


def register() -> None:
    from vllm import ModelRegistry
    from vllm.transformers_utils import config as vllm_config_module

    from ..configuration import MODEL_TYPE
    from .vllm_config import VLLMTrimmedDrafterConfig

    # vLLM's table of config classes by model_type (the one it consults for its own out-of-transformers configs);
    # vLLM then registers the class with transformers' AutoConfig itself, in its processes.
    vllm_config_module._CONFIG_REGISTRY[MODEL_TYPE] = VLLMTrimmedDrafterConfig
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, "hf_vocabspec.serving.vllm_model:TrimmedDrafterForVLLM")
