"""Assistant-token counting and the coverage math, on the real SmolLM2 tokenizer."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from safetensors.torch import save_file

from hf_vocabspec.coverage import TokenCounts, assistant_texts, assistant_turn_format, count_assistant_tokens
from hf_vocabspec.offline import load_chat_dataset, load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("offline:smollm2-135m-instruct")


CONVO = {"messages": [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue, mostly."},
    {"role": "user", "content": "Another?"},
    {"role": "assistant", "content": "Green."},
]}
SHAREGPT = {"conversations": [
    {"from": "system", "value": "You are terse."},
    {"from": "human", "value": "Name a colour."},
    {"from": "gpt", "value": "Blue, mostly."},
    {"from": "human", "value": "Another?"},
    {"from": "gpt", "value": "Green."},
]}


def test_template_probe_finds_chatml_end_marker(tok):
    assert assistant_turn_format(tok).suffix == "<|im_end|>"


def test_hand_counted_example_counts_only_assistant_text(tok):
    counts = count_assistant_tokens([CONVO], tok, progress=False)
    expected = torch.zeros(len(tok), dtype=torch.long)
    for text in ("Blue, mostly.<|im_end|>", "Green.<|im_end|>"):
        for t in tok(text, add_special_tokens=False)["input_ids"]:
            expected[t] += 1
    assert torch.equal(counts.counts, expected)
    assert counts.counts[tok.eos_token_id] == 2  # one end-of-turn per assistant turn
    for t in tok("Name a colour. You are terse. Another?", add_special_tokens=False)["input_ids"]:
        if expected[t] == 0:
            assert counts.counts[t] == 0
    assert list(assistant_texts([CONVO], tok)) == ["Blue, mostly.<|im_end|>", "Green.<|im_end|>"]


def test_both_formats_and_iterable_dataset_agree(tok):
    a = count_assistant_tokens([CONVO] * 3, tok, progress=False)
    b = count_assistant_tokens([SHAREGPT] * 3, tok, progress=False)
    c = count_assistant_tokens(Dataset.from_list([CONVO] * 3).to_iterable_dataset(), tok, progress=False)
    assert torch.equal(a.counts, b.counts) and torch.equal(a.counts, c.counts)
    assert a.num_examples == 3 and a.num_assistant_turns == 6


@pytest.fixture(scope="module")
def real_counts(tok):
    return count_assistant_tokens(load_chat_dataset("offline:sharegpt"), tok, max_examples=300, progress=False)


def test_coverage_math(real_counts):
    c = real_counts
    curve = c.coverage_curve()
    assert torch.all(curve[1:] >= curve[:-1]) and abs(c.coverage(c.vocab_size) - 1) < 1e-12
    for target in (0.5, 0.9, 0.95):
        k = c.smallest_k_for_coverage(target)
        assert c.coverage(k) >= target > c.coverage(k - 1)
        assert abs(c.coverage_of(c.top_k(k)) - c.coverage(k)) < 1e-12
    with pytest.raises(ValueError, match="coverage"):
        c.smallest_k_for_coverage(1.5)


def test_save_load_and_merge(tmp_path, tok, real_counts):
    path = tmp_path / "counts.safetensors"
    real_counts.save(path)
    loaded = TokenCounts.load(path)
    assert torch.equal(loaded.counts, real_counts.counts) and loaded.num_examples == 300
    ds = load_chat_dataset("offline:sharegpt").select(range(300))
    first = count_assistant_tokens(ds.select(range(120)), tok, progress=False)
    second = count_assistant_tokens(ds.select(range(120, 300)), tok, progress=False)
    merged = first + second
    assert torch.equal(merged.counts, real_counts.counts) and merged.num_assistant_turns == real_counts.num_assistant_turns
    foreign = tmp_path / "foreign.safetensors"
    save_file({"weight": torch.zeros(3)}, foreign)
    with pytest.raises(ValueError, match="not an hf_vocabspec counts file"):
        TokenCounts.load(foreign)
    with pytest.raises(ValueError, match="different tokenizers"):
        real_counts + TokenCounts(torch.zeros(5, dtype=torch.long), 1, 1, "other")


def test_errors_name_the_fix(tok):
    with pytest.raises(ValueError, match="No assistant turns"):
        count_assistant_tokens([{"messages": [{"role": "user", "content": "hi"}]}], tok, progress=False)
    with pytest.raises(ValueError, match="messages"):
        count_assistant_tokens([{"text": "hello"}], tok, progress=False)
