"""A trimmed drafter's config.json as vLLM reads it: the body's fields at the top level, the target's vocabulary size.

vLLM sizes a model (layers, heads, KV cache, positions, rope) from top-level fields of its config; ours keeps the
body's config under ``drafter_config``. :class:`VLLMTrimmedDrafterConfig` is the same config with the body's fields
copied up (our own fields win), so vLLM's engine and its in-tree body classes read them where they look. Its
``vocab_size`` stays the FULL (target) vocabulary: vLLM's ``draft_model`` requires the drafter's to equal the
target's, and :class:`~hf_vocabspec.serving.vllm_model.TrimmedDrafterForVLLM` returns logits over all of it.

Registered with vLLM for ``model_type`` ``hf_vocabspec_trimmed_drafter`` by the plugin (``vllm_plugin.register``);
transformers' own loading (``TrimmedDrafter.from_pretrained``) uses :class:`TrimmedDrafterConfig` and is unchanged.
"""

from __future__ import annotations

from ..configuration import TrimmedDrafterConfig

__all__ = ["SUPPORTED_BODIES", "VLLMTrimmedDrafterConfig", "flatten_body"]

# body model_type -> vLLM's own implementation of the drafter's base architecture (vllm.model_executor.models.*; the
# classes themselves: vllm_model.body_class)
SUPPORTED_BODIES = {"llama": "LlamaModel", "qwen2": "Qwen2Model", "qwen3": "Qwen3Model", "gemma3_text": "Gemma3Model"}

# our own fields (and bookkeeping) that a body field of the same name must not overwrite
_KEEP = frozenset({"vocab_size", "model_type", "architectures", "auto_map", "tie_word_embeddings", "dtype",
                   "torch_dtype", "transformers_version", "_name_or_path", "name_or_path", "draft_vocab_size"})


def flatten_body(config: TrimmedDrafterConfig) -> TrimmedDrafterConfig:
    """Copy the body's config fields onto ``config`` (in place; ours win) and refuse what vLLM cannot serve exactly
    as saved, in one line naming the fix."""
    body = config.body_config()
    body_type = body.model_type
    if body_type not in SUPPORTED_BODIES:
        raise ValueError(f"hf_vocabspec's vLLM plugin serves drafters whose base is one of "
                         f"{sorted(SUPPORTED_BODIES)}; this one is {body_type!r}: serve it with transformers "
                         "(target.generate(assistant_model=drafter)).")
    body_vocab = getattr(body, "vocab_size", None)
    if body_vocab != config.vocab_size:
        raise ValueError(f"The drafter's body embeds {body_vocab} tokens but config.json says vocab_size "
                         f"{config.vocab_size}: re-save the drafter with hf_vocabspec (save_pretrained).")
    for key, value in body.to_dict().items():
        if key not in _KEEP:
            setattr(config, key, value)
    config.body_model_type = body_type
    return config


class VLLMTrimmedDrafterConfig(TrimmedDrafterConfig):
    """:class:`TrimmedDrafterConfig` with its body's fields at the top level (what vLLM reads)."""

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        out = super().from_dict(config_dict, **kwargs)
        flatten_body(out[0] if isinstance(out, tuple) else out)
        return out
