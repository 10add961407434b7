"""Real offline models and text: SmolLM2-135M-Instruct (fp32 target) with a trimmed bf16 copy as drafter."""

from __future__ import annotations

import pytest
import torch

from hf_vocabspec import TrimmedDrafter, trim_drafter
from hf_vocabspec.coverage import count_assistant_tokens
from hf_vocabspec.evaluation.benchmark import eval_prompts
from hf_vocabspec.evaluation.offline import (
    load_chat_dataset,
    load_model,
    load_tokenizer,
)

pytestmark = pytest.mark.integration
SMOL = "offline:smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    tokenizer = load_tokenizer(SMOL)
    dataset = load_chat_dataset("offline:sharegpt")
    counts = count_assistant_tokens(dataset, tokenizer, max_examples=1500, progress=False)
    keep = counts.top_k(counts.smallest_k_for_coverage(0.95))
    target = load_model(SMOL, dtype=torch.float32).eval()
    drafter = trim_drafter(load_model(SMOL, dtype=torch.bfloat16), keep, tokenizer=tokenizer, target_model=SMOL)
    path = tmp_path_factory.mktemp("drafter")
    drafter.save_pretrained(path)
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    assert isinstance(reloaded, TrimmedDrafter)
    prompts = eval_prompts(dataset, tokenizer, start=len(dataset) - 500, n=3, max_prompt_tokens=128)
    return tokenizer, target, reloaded, prompts, counts, keep


def test_trimmed_vocabulary_is_small_and_keeps_chat_tokens(smol):
    tokenizer, _, drafter, _, counts, keep = smol
    assert drafter.config.draft_vocab_size < 0.6 * len(tokenizer)
    kept = set(drafter.d2t.tolist())
    assert {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_start|>")}.issubset(kept)
    assert drafter.config.draft_vocab_size <= keep.numel() + 5  # only a handful of forced specials
    assert counts.coverage(int(keep.numel())) >= 0.95


def test_greedy_output_identical_to_target_on_real_prompts(smol):
    _, target, drafter, prompts, _, _ = smol
    assert len(prompts) == 3
    accepted = proposed = 0
    for ids in prompts:
        mask = torch.ones_like(ids)
        ref = target.generate(ids, attention_mask=mask, max_new_tokens=32, do_sample=False)
        out = target.generate(ids, attention_mask=mask, max_new_tokens=32, do_sample=False, assistant_model=drafter)
        assert torch.equal(ref, out)
        accepted += drafter.last_speculation_stats.accepted
        proposed += drafter.last_speculation_stats.proposed
    assert accepted / proposed > 0.5  # a bf16 copy agrees with its fp32 original most of the time


def test_sampling_runs_on_real_model(smol):
    _, target, drafter, prompts, _, _ = smol
    torch.manual_seed(0)
    out = target.generate(prompts[0], attention_mask=torch.ones_like(prompts[0]), max_new_tokens=16,
                          do_sample=True, temperature=0.7, top_p=0.9, repetition_penalty=1.1,
                          assistant_model=drafter)
    assert out.shape[1] > prompts[0].shape[1]
    assert drafter.last_speculation_stats.proposed > 0
