"""A trimmed drafter as a vLLM model: vLLM's own body for its base architecture, a head of only the kept rows.

Built by vLLM (``method: "draft_model"``) from the same folder ``TrimmedDrafter.save_pretrained`` writes: the body
is vLLM's implementation of the base (``vllm_config.SUPPORTED_BODIES``: Llama, Qwen2/2.5, Qwen3, Gemma 3), the head
is ``ParallelLMHead(draft_vocab_size, hidden)`` holding the kept rows, and :meth:`compute_logits` scatters the kept
logits into the FULL target vocabulary with -inf at every pruned id, so vLLM's greedy drafting (argmax) and its
probabilistic drafting (softmax) never propose a pruned id and its rejection sampler keeps the target's output.

What vLLM does not give a model, or runs otherwise, and how it is handled (the output stays the target's in each):
- context tokens (``config.context_tokens``) need the request's context at head time, which vLLM's
  ``compute_logits`` does not receive: the drafter drafts from its kept rows only (a warning says so);
- an RDK kernel (``config.rdk``) is transformers-side sampling: not applied (a warning says so);
- ``weight_quantization`` int8/int4: the saved weights ARE the quantized values, loaded as saved; vLLM runs them
  with its own dense kernels (the same drafter, without the int kernels' speed).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.utils import AutoWeightsLoader, maybe_prefix

from ..configuration import VocabularyMapError
from ..modeling import _head_transform, vocab_map_sha256
from .vllm_config import SUPPORTED_BODIES, flatten_body

__all__ = ["TrimmedDrafterForVLLM", "body_class"]

logger = init_logger(__name__)

# checkpoint buffers that only transformers-side features read (context tokens of untied heads, RDK sampling)
_TRANSFORMERS_ONLY = ("context_ids", "context_head", "rdk_targets", "rdk_weights")
_FIX = "re-create the drafter with hf_vocabspec.trim_drafter(base_model, keep_token_ids) and save it again"


def body_class(model_type: str) -> type[nn.Module]:
    """vLLM's body class for a supported base (``vllm_config.SUPPORTED_BODIES``)."""
    from vllm.model_executor.models import gemma3, llama, qwen2, qwen3

    classes = {"llama": llama.LlamaModel, "qwen2": qwen2.Qwen2Model, "qwen3": qwen3.Qwen3Model,
               "gemma3_text": gemma3.Gemma3Model}
    assert set(classes) == set(SUPPORTED_BODIES)
    return classes[model_type]


class TrimmedDrafterForVLLM(nn.Module):
    """vLLM model class for a saved :class:`~hf_vocabspec.modeling.TrimmedDrafter` (architecture ``TrimmedDrafter``)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        if not hasattr(config, "body_model_type"):  # read by some other path than the plugin's config class
            flatten_body(config)
        self.config = config
        self.model = body_class(config.body_model_type)(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        k, vocab = int(config.draft_vocab_size), int(config.vocab_size)
        self.lm_head = ParallelLMHead(k, config.hidden_size, prefix=maybe_prefix(prefix, "lm_head"))
        self.logits_processor = LogitsProcessor(k)
        self._transform = _head_transform(config.body_config())  # softcap / logit scale, as transformers' class
        self.vocab_size = vocab
        # -1 marks "not loaded": load_weights refuses a checkpoint without the map
        self.register_buffer("d2t", torch.full((k,), -1, dtype=torch.long), persistent=False)
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors
        if getattr(config, "context_tokens", False):
            logger.warning("hf_vocabspec drafter: context tokens are not supported in vLLM (compute_logits gets no "
                           "context); the drafter drafts from its %d kept rows only. The output is still the "
                           "target's.", k)
        if getattr(config, "rdk", None):
            logger.warning("hf_vocabspec drafter: the RDK kernel is not applied in vLLM (transformers-side "
                           "sampling); the output is still the target's.")
        if getattr(config, "weight_quantization", None):
            logger.info("hf_vocabspec drafter: weight_quantization=%r values load as saved and run with vLLM's "
                        "dense kernels.", config.weight_quantization)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors=None,
                inputs_embeds: torch.Tensor | None = None, **kwargs):
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)

    def kept_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """Logits over the kept rows only (draft ids), after the architecture's logit transform."""
        logits = self.logits_processor(self.lm_head, hidden_states)
        return None if logits is None else self._transform(logits)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """Logits over the full target vocabulary: the kept rows at their target ids, -inf at every pruned id."""
        kept = self.kept_logits(hidden_states)
        if kept is None:
            return None
        out = kept.new_full((*kept.shape[:-1], self.vocab_size), float("-inf"))
        out[..., self.d2t] = kept
        return out

    def get_top_tokens(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Greedy draft ids as target ids (``use_local_argmax_reduction``): the argmax over the kept rows; d2t is
        ascending, so ties resolve to the smallest target id as over the full vector."""
        return self.d2t[self.kept_logits(hidden_states).argmax(dim=-1)]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        rest, loaded = [], set()
        for name, tensor in weights:
            if name == "d2t":
                if tensor.shape != self.d2t.shape:
                    raise VocabularyMapError(f"The drafter's d2t has shape {tuple(tensor.shape)}, config.json says "
                                             f"{tuple(self.d2t.shape)}: {_FIX}.")
                self.d2t.copy_(tensor.to(self.d2t.device, torch.long))
                loaded.add(name)
            elif name not in _TRANSFORMERS_ONLY:
                rest.append((name, tensor))
        if "d2t" not in loaded:
            raise VocabularyMapError(f"The drafter checkpoint has no draft->target map (`d2t`): {_FIX}.")
        self._check_vocab_map()
        loaded |= AutoWeightsLoader(self).load_weights(rest)
        return loaded

    def _check_vocab_map(self) -> None:
        d2t, k = self.d2t.cpu(), self.d2t.numel()
        if bool((d2t < 0).any()) or bool((d2t >= self.vocab_size).any()) or (
                k > 1 and not bool((d2t[1:] > d2t[:-1]).all())):
            raise VocabularyMapError(f"The drafter's d2t is not strictly increasing target ids below "
                                     f"{self.vocab_size}: {_FIX}.")
        expected = getattr(self.config, "vocab_map_sha256", None)
        if expected is not None and vocab_map_sha256(d2t) != expected:
            raise VocabularyMapError("The drafter's d2t does not match the checksum in its config.json (weights and "
                                     f"config from different drafters, or a corrupt file): {_FIX}.")
