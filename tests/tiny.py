"""Tiny random target/drafter pairs with a small vocabulary, for fast exact tests.

The target's head is scaled up so its next-token distributions are peaked (a near-uniform p would let a
wrong q pass unnoticed); the drafter is a perturbed copy, so q is close to p but not equal.
"""

from __future__ import annotations

import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
)

VOCAB = 64
EOS = 2


def llama_config(**kw) -> LlamaConfig:
    base = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    base.update(kw)
    return LlamaConfig(**base)


def gemma3_config(**kw) -> Gemma3TextConfig:
    base = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        max_position_embeddings=256,
        tie_word_embeddings=True,
        final_logit_softcapping=30.0,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    base.update(kw)
    return Gemma3TextConfig(**base)


def make_pair(kind: str = "llama", seed: int = 0, head_scale: float = 40.0, noise: float = 0.3):
    """(target, drafter) in fp32, eval mode; drafter = target + noise (same tokenizer / vocabulary)."""
    torch.manual_seed(seed)
    if kind == "llama":
        target = LlamaForCausalLM(llama_config()).eval()
        drafter = LlamaForCausalLM(llama_config()).eval()
    elif kind == "gemma3":
        target = Gemma3ForCausalLM(gemma3_config()).eval()
        drafter = Gemma3ForCausalLM(gemma3_config()).eval()
    else:
        raise ValueError(kind)
    with torch.no_grad():
        head = target.get_output_embeddings().weight
        head.mul_(head_scale)
        drafter.load_state_dict(target.state_dict())
        for p in drafter.parameters():
            p.add_(noise * p.std() * torch.randn_like(p))
    target.generation_config.pad_token_id = 0
    drafter.generation_config.pad_token_id = 0
    return target, drafter
