"""Offline real assets: names resolve, datasets have the documented shape, models load from the cache fast."""

from __future__ import annotations

import json
import time

import pytest

from hf_vocabspec.offline import list_offline_names, load_chat_dataset, load_model, load_tokenizer, resolve_model_path


def test_sharegpt_counts_and_roles():
    ds = load_chat_dataset("offline:sharegpt")
    assert len(ds) == 17671
    roles = {m["role"] for row in ds.select(range(2000))["messages"] for m in row}
    assert roles <= {"system", "user", "assistant"}
    assistant = sum(m["role"] == "assistant" for row in ds["messages"] for m in row)
    assert assistant >= 67594  # 67,594 "gpt" turns, plus a few chatgpt/bing/bard turns


def test_small_datasets():
    assert len(load_chat_dataset("offline:humaneval")) == 164
    assert len(load_chat_dataset("offline:chatterbot")) >= 2000
    assert len(load_chat_dataset("offline:humaneval", split="train[:10]")) == 10


def test_unknown_names_list_known_ones():
    with pytest.raises(ValueError, match="offline:sharegpt"):
        load_chat_dataset("offline:nope")
    with pytest.raises(ValueError, match="offline:smollm2-135m-instruct"):
        resolve_model_path("offline:nope")
    assert "offline:gemma-3-270m" in list_offline_names()


def test_local_files_and_hub_ids_pass_through(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}))
    assert load_chat_dataset(str(path))[0]["messages"][1]["content"] == "b"
    assert resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.mark.integration
def test_smollm2_tokenizer_and_cached_model_load_fast():
    tok = load_tokenizer("offline:smollm2-135m-instruct")
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    resolve_model_path("offline:smollm2-135m-instruct")  # converts once if needed
    t0 = time.perf_counter()
    model = load_model("offline:smollm2-135m-instruct")
    assert time.perf_counter() - t0 < 15
    assert model.config.vocab_size == 49152 and model.generation_config.eos_token_id == 2
