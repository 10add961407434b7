"""Assistant-token counting and the coverage math, on the real SmolLM2 (ChatML) and Gemma 3 tokenizers."""

from __future__ import annotations

import json

import pytest
import torch
from datasets import Dataset
from safetensors.torch import save_file
from tiny import llama_config
from transformers import LlamaForCausalLM

import hf_vocabspec
from hf_vocabspec.coverage import TokenCounts, assistant_texts, assistant_turn_format, count_assistant_tokens
from hf_vocabspec.evaluation.offline import load_chat_dataset, load_model, load_tokenizer


@pytest.fixture(scope="session")
def gemma_tok():
    return load_tokenizer("offline:gemma-3-270m")


@pytest.fixture(scope="session")
def sharegpt():
    return load_chat_dataset("offline:sharegpt").select(range(300))


CONVO = {"messages": [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue, mostly."},
    {"role": "user", "content": "Another?"},
    {"role": "assistant", "content": "  Green.\n"},
]}
SHAREGPT = {"conversations": [
    {"from": "system", "value": "You are terse."},
    {"from": "human", "value": "Name a colour."},
    {"from": "gpt", "value": "Blue, mostly."},
    {"from": "human", "value": "Another?"},
    {"from": "gpt", "value": "  Green.\n"},
]}


def _bincount(tokenizer, texts) -> torch.Tensor:
    ids = [t for text in texts for t in tokenizer(text, add_special_tokens=False)["input_ids"]]
    return torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=len(tokenizer))


def test_template_probe_finds_end_marker_and_trimming(tok, gemma_tok):
    chatml = assistant_turn_format(tok)
    assert (chatml.suffix, chatml.trims, chatml.head) == ("<|im_end|>", False, "")  # ChatML keeps whitespace
    gemma = assistant_turn_format(gemma_tok)
    assert (gemma.suffix, gemma.trims, gemma.head) == ("<end_of_turn>", True, "")  # "| trim", newline dropped
    assert list(assistant_texts([CONVO], gemma_tok)) == ["Blue, mostly.<end_of_turn>", "Green.<end_of_turn>"]


def test_hand_counted_example_counts_only_assistant_text(tok):
    expected_texts = ["Blue, mostly.<|im_end|>", "  Green.\n<|im_end|>"]
    assert list(assistant_texts([CONVO], tok)) == expected_texts
    counts = count_assistant_tokens([CONVO], tok, progress=False)
    assert torch.equal(counts.counts, _bincount(tok, expected_texts))
    assert (counts.num_examples, counts.num_assistant_turns) == (1, 2)
    assert counts.num_tokens == len(tok("Blue, mostly.", add_special_tokens=False)["input_ids"]) + len(
        tok("  Green.\n", add_special_tokens=False)["input_ids"]) + 2
    # user/system-only tokens, the role header and the <|im_start|> marker are not counted
    other = tok("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nName a colour. Another?"
                "<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    only_there = {t for t in other if _bincount(tok, expected_texts)[t] == 0}
    assert len(only_there) >= 8 and tok.convert_tokens_to_ids("<|im_start|>") in only_there
    assert all(counts.counts[t] == 0 for t in only_there)


def test_end_of_turn_counted_once_per_assistant_turn(tok, gemma_tok, sharegpt):
    c = count_assistant_tokens(sharegpt, tok, progress=False)
    assert c.counts[tok.convert_tokens_to_ids("<|im_end|>")] == c.num_assistant_turns > 300
    g = count_assistant_tokens(sharegpt.select(range(50)), gemma_tok, progress=False)
    assert g.counts[gemma_tok.convert_tokens_to_ids("<end_of_turn>")] == g.num_assistant_turns
    assert g.counts[gemma_tok.convert_tokens_to_ids("<start_of_turn>")] == 0 and g.counts[gemma_tok.bos_token_id] == 0


@pytest.mark.parametrize("which", ["tok", "gemma_tok"])
def test_counts_equal_the_templates_in_context_assistant_tokens(which, request, sharegpt):
    """Fast path (content + marker, tokenized alone) == tokens of the FULL render inside assistant spans."""
    tokenizer = request.getfixturevalue(which)
    fmt = assistant_turn_format(tokenizer)
    # (a conversation that OPENS with an assistant turn has no generation prompt to locate it by)
    convos = [ex for ex in sharegpt.select(range(60)) if ex["messages"] and ex["messages"][0]["role"] != "assistant"]
    expected = torch.zeros(len(tokenizer), dtype=torch.long)
    for ex in convos:
        msgs = ex["messages"]
        full = tokenizer.apply_chat_template(msgs, tokenize=False)
        enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
        spans = []
        for i, m in enumerate(msgs):
            if m["role"] == "assistant":
                start = len(tokenizer.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True))
                text = fmt.render(m["content"])
                assert full[start:start + len(text)] == text
                spans.append((start, start + len(text)))
        for t, (s, e) in zip(enc["input_ids"], enc["offset_mapping"]):
            expected[t] += any(a <= s and e <= b for a, b in spans)
    got = count_assistant_tokens(convos, tokenizer, progress=False)
    assert torch.equal(got.counts, expected)


def test_both_formats_and_iterable_dataset_agree(tok):
    a = count_assistant_tokens([CONVO] * 3, tok, progress=False)
    b = count_assistant_tokens([SHAREGPT] * 3, tok, progress=False)
    c = count_assistant_tokens(Dataset.from_list([CONVO] * 3).to_iterable_dataset(), tok, progress=False)
    d = count_assistant_tokens(Dataset.from_list([SHAREGPT] * 5), tok, max_examples=3, progress=False)
    for other in (b, c, d):
        assert torch.equal(a.counts, other.counts)
        assert (other.num_examples, other.num_assistant_turns) == (3, 6)


@pytest.fixture(scope="session")
def real_counts(tok, sharegpt):
    return count_assistant_tokens(sharegpt, tok, progress=False, batch_size=64)


def test_coverage_math(real_counts):
    c = real_counts
    assert c.counts.dtype == torch.int64 and c.vocab_size == 49152 and c.tokenizer_name
    ranked = c.ranked_token_ids()
    assert torch.all(c.counts[ranked][1:] <= c.counts[ranked][:-1])
    zeros = ranked[c.counts[ranked] == 0]
    assert torch.equal(zeros, zeros.sort().values)  # ties broken by ascending id
    curve = c.coverage_curve()
    assert curve.dtype == torch.float64 and curve.numel() == c.vocab_size
    assert torch.all(curve[1:] >= curve[:-1]) and c.coverage(c.vocab_size) == 1.0 and c.coverage(0) == 0.0
    assert c.coverage(1) == c.counts.max().item() / c.num_tokens
    for target in (1e-9, 0.5, 0.9, 0.95, 0.999, 1.0):
        k = c.smallest_k_for_coverage(target)
        assert c.coverage(k) >= target > c.coverage(k - 1)
        assert c.coverage_of(c.top_k(k)) == pytest.approx(c.coverage(k), abs=1e-12)
        assert c.top_k(k).numel() == k
    assert c.coverage_of(list(range(c.vocab_size)) + [10**9]) == 1.0
    for bad in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"coverage must be in \(0, 1\]"):
            c.smallest_k_for_coverage(bad)


def test_save_load_round_trip_and_foreign_files(tmp_path, real_counts):
    path = tmp_path / "counts.safetensors"
    real_counts.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["counts.safetensors"]  # no temp file left behind
    loaded = TokenCounts.load(path)
    assert torch.equal(loaded.counts, real_counts.counts)
    assert (loaded.num_examples, loaded.num_assistant_turns, loaded.tokenizer_name) == (
        real_counts.num_examples, real_counts.num_assistant_turns, real_counts.tokenizer_name)
    foreign = tmp_path / "foreign.safetensors"
    save_file({"counts": torch.zeros(3, dtype=torch.int64)}, foreign)
    with pytest.raises(ValueError, match="not an hf_vocabspec counts file"):
        TokenCounts.load(foreign)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"definitely not safetensors")
    with pytest.raises(ValueError, match="not a readable counts file"):
        TokenCounts.load(garbage)


def test_merge_of_halves_equals_whole(tok, sharegpt, real_counts):
    first = count_assistant_tokens(sharegpt.select(range(120)), tok, progress=False)
    second = count_assistant_tokens(sharegpt.select(range(120, 300)), tok, progress=False)
    for merged in (first + second, sum([first, second])):
        assert torch.equal(merged.counts, real_counts.counts)
        assert (merged.num_examples, merged.num_assistant_turns) == (300, real_counts.num_assistant_turns)
        assert merged.coverage(1000) == real_counts.coverage(1000)
    with pytest.raises(ValueError, match="different tokenizers"):
        real_counts + TokenCounts(torch.zeros(5, dtype=torch.long), 1, 1, "other")
    with pytest.raises(ValueError, match="different tokenizers"):
        real_counts + TokenCounts(torch.zeros(49152, dtype=torch.long), 1, 1, "other")


def test_errors_say_what_was_expected_and_found(tok):
    with pytest.raises(ValueError, match=r"No assistant turns.*'messages'.*'conversations'.*roles \['system', 'user'\]"):
        count_assistant_tokens([{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]}],
                               tok, progress=False)
    with pytest.raises(ValueError, match=r"No assistant turns in|No assistant turns found in 0"):
        count_assistant_tokens([], tok, progress=False)
    with pytest.raises(ValueError, match=r"Unknown dataset format.*'messages'.*'conversations'.*\['text'\]"):
        count_assistant_tokens([{"text": "hello"}], tok, progress=False)


def test_probe_handles_other_templates_and_falls_back_without_one(tok, monkeypatch):
    # real attribute changes on the real tokenizer (restored by monkeypatch), no mocks
    think = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}<think></think>"
             "{{ m.content.rstrip() }}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    monkeypatch.setattr(tok, "chat_template", think)
    fmt = assistant_turn_format(tok)
    assert (fmt.head, fmt.suffix, fmt.trims, fmt.lstrip, fmt.rstrip) == ("<think></think>", "<|im_end|>", False, False, True)
    assert list(assistant_texts([CONVO], tok))[1] == "<think></think>  Green.<|im_end|>"
    monkeypatch.setattr(tok, "chat_template", None)
    with pytest.warns(UserWarning, match="no chat template"):
        texts = list(assistant_texts([SHAREGPT], tok))
    assert texts == ["Blue, mostly." + tok.eos_token, "  Green.\n" + tok.eos_token]


def test_counts_files_from_before_the_shared_checksum_still_load(tmp_path):
    """issue #29: counts files are read and checksummed by _io now; the file format is unchanged, so a file written
    the old way (the checksum over the vector's bytes, then the metadata JSON) loads, and one that _io's
    described layout would have checksummed is not what save() writes."""
    import hashlib
    import json

    from hf_vocabspec._io import tensors_checksum

    counts = torch.tensor([5, 0, 3, 9], dtype=torch.int64)
    meta = {"format": "hf_vocabspec.TokenCounts/1", "num_examples": "2", "num_assistant_turns": "3",
            "tokenizer_name": "tiny", "tokenizer_sha256": "a" * 64}
    h = hashlib.sha256(counts.numpy().tobytes())
    h.update(json.dumps(dict(sorted(meta.items()))).encode())
    save_file({"counts": counts}, tmp_path / "old.safetensors", metadata={**meta, "counts_sha256": h.hexdigest()})
    loaded = TokenCounts.load(tmp_path / "old.safetensors")
    assert torch.equal(loaded.counts, counts) and (loaded.num_examples, loaded.num_assistant_turns) == (2, 3)
    loaded.save(tmp_path / "new.safetensors")  # written again: byte-for-byte the same checksum
    assert TokenCounts.load(tmp_path / "new.safetensors").counts.tolist() == counts.tolist()
    assert tensors_checksum({"counts": counts}, meta, skip="counts_sha256") != h.hexdigest()  # power: layouts differ


# --- bad input: counts files and assistant turns --------------------------------------------------------------------
def test_counts_file_and_model_file_swapped(tmp_path, counts_file):
    with pytest.raises(ValueError, match="counts file \\(counts go to .*--counts`\\), not a model"):
        load_model(str(counts_file))
    model = LlamaForCausalLM(llama_config())
    model.save_pretrained(tmp_path / "m")
    with pytest.raises(ValueError, match="looks like model weights") as err:
        TokenCounts.load(tmp_path / "m" / "model.safetensors")
    assert len(str(err.value)) < 400  # not hundreds of tensor names
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        (tmp_path / "m" / "config.json").unlink()
        load_model(str(tmp_path / "m"))


def test_counts_refuse_another_tokenizer_of_the_same_size(counts_file, tok, same_size_other_tok):
    counts = TokenCounts.load(counts_file)
    counts.check_tokenizer(tok)
    with pytest.raises(ValueError, match="fingerprints differ"):
        counts.check_tokenizer(same_size_other_tok)
    with pytest.raises(ValueError, match="different tokenizers"):
        counts + TokenCounts(counts.counts, 1, 1, counts.tokenizer_name, "0" * 64)


class safe_open_meta:  # noqa: N801 - a tiny context manager: (tensors, metadata) of a safetensors file
    def __init__(self, path):
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            self.value = ({k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {}))

    def __enter__(self):
        return self.value

    def __exit__(self, *exc):
        return False


def test_counts_without_fingerprint_or_cut_short_are_refused(tmp_path, counts_file, tok):
    with safe_open_meta(counts_file) as (tensors, meta):
        pass
    no_print = dict(meta, tokenizer_sha256="")
    save_file(tensors, str(tmp_path / "old.safetensors"), metadata=no_print)
    with pytest.raises(ValueError, match="has no tokenizer fingerprint .*recount with `hf-vocabspec count"):
        TokenCounts.load(tmp_path / "old.safetensors")
    save_file({"counts": tensors["counts"][:1000].clone()}, str(tmp_path / "short.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match="does not match its checksum .*recount with `hf-vocabspec count"):
        TokenCounts.load(tmp_path / "short.safetensors")
    edited = dict(meta, num_examples="999")
    save_file(tensors, str(tmp_path / "edited.safetensors"), metadata=edited)
    with pytest.raises(ValueError, match="does not match its checksum"):
        TokenCounts.load(tmp_path / "edited.safetensors")
    counts = TokenCounts.load(counts_file)
    short = TokenCounts(counts.counts[:1000], 1, 1, counts.tokenizer_name, counts.tokenizer_sha256)
    with pytest.raises(ValueError, match="the vector is cut short"):
        short.check_tokenizer(tok)
    with pytest.raises(ValueError, match="carry no tokenizer fingerprint"):
        TokenCounts(counts.counts, 1, 1, "x").check_tokenizer(tok)


def test_assistant_turns_without_content_are_not_turns(tok):
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": content}]}
            for content in (None, "", "  \n")]
    rows.append({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]})
    counts = hf_vocabspec.count_assistant_tokens(rows, tok, progress=False)
    assert counts.num_assistant_turns == 1
    assert counts.num_tokens == len(tok("hello there", add_special_tokens=False)["input_ids"]) + 1  # + end marker
    with pytest.raises(ValueError, match="No assistant turns"):
        hf_vocabspec.count_assistant_tokens(rows[:3], tok, progress=False)


def test_empty_assistant_turns_are_named_as_empty(tok):
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": content}]}
            for content in (None, "", "  \n")]
    with pytest.raises(ValueError, match="all 3 assistant turn\\(s\\) have empty content") as err:
        hf_vocabspec.count_assistant_tokens(rows, tok, progress=False)
    assert "roles" not in str(err.value)
