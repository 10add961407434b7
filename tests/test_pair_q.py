"""Pair Q, the real distinct pair: Qwen2.5-Coder-0.5B-Instruct (trimmed, context tokens on) drafting for
Qwen2.5-Coder-1.5B-Instruct (fp32). Greedy output must be token-identical to target-only on held-out
ShareGPT and HumanEval prompts. Short on purpose (a 1.5B fp32 decode step is ~0.3-0.4 s on 2 cores): 3
prompts x 16 new tokens; the models are converted once into the cache (`make setup-pair` installs them).
"""

from __future__ import annotations

import pytest
import torch

from hf_vocabspec import TrimmedDrafter, trim_drafter
from hf_vocabspec.coverage import count_assistant_tokens
from hf_vocabspec.kernels import native_bf16
from hf_vocabspec.evaluation.data import count_split, eval_prompts
from hf_vocabspec.evaluation.offline import load_chat_dataset, load_model, load_tokenizer

pytestmark = pytest.mark.integration
TARGET = "offline:qwen2.5-coder-1.5b-instruct"
DRAFTER = "offline:qwen2.5-coder-0.5b-instruct"
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def pair_q(tmp_path_factory):
    tokenizer = load_tokenizer(TARGET)
    counted, held_out = count_split(load_chat_dataset("offline:sharegpt"), 1000)
    counts = count_assistant_tokens(counted, tokenizer, progress=False)
    keep = counts.top_k(counts.smallest_k_for_coverage(0.95))
    dtype = torch.bfloat16 if native_bf16() else torch.float32  # the drafter's dtype where users run it
    drafter = trim_drafter(load_model(DRAFTER, dtype=dtype), keep, tokenizer=tokenizer, target_model=TARGET)
    path = tmp_path_factory.mktemp("drafter-q")
    drafter.save_pretrained(path)
    reloaded = TrimmedDrafter.from_pretrained(path, dtype=dtype).eval()
    assert torch.equal(reloaded.context_head, drafter.context_head)
    del drafter
    prompts = eval_prompts(held_out, tokenizer, start=len(held_out) - 500, n=2, max_prompt_tokens=256)
    prompts += eval_prompts(load_chat_dataset("offline:humaneval"), tokenizer, start=0, n=1, max_prompt_tokens=256)
    target = load_model(TARGET, dtype=torch.float32).eval()
    return tokenizer, target, reloaded, prompts, keep


def test_untied_drafter_keeps_its_pruned_rows_for_context_tokens(pair_q):
    tokenizer, _, drafter, _, keep = pair_q
    assert not drafter.config.drafter_config["tie_word_embeddings"]  # the GGUF carries its own output matrix
    assert drafter.supports_context_tokens and drafter.use_context_tokens and drafter.has_context_head
    k, v = drafter.config.draft_vocab_size, drafter.config.vocab_size
    assert v == 151936 and k <= keep.numel() + 8 and drafter.config.context_head_size == v - k
    assert {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|im_start|>")} <= set(
        drafter.d2t.tolist())


def test_greedy_output_identical_to_target_with_context_tokens(pair_q):
    _, target, drafter, prompts, _ = pair_q
    assert len(prompts) == 3  # 2 held-out ShareGPT + 1 HumanEval
    accepted = proposed = 0
    for ids in prompts:
        mask = torch.ones_like(ids)
        ref = target.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False)
        out = target.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                              assistant_model=drafter)
        assert torch.equal(ref, out)
        accepted += drafter.last_speculation_stats.accepted
        proposed += drafter.last_speculation_stats.proposed
    assert accepted / proposed > 0.4  # a distinct, smaller model of the family: it agrees often, not always
