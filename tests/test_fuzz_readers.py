"""Readers of our files never let a library's traceback through, and never return a wrong result.

Each reader gets truncated, bit-flipped, metadata-edited and wrong-type files (hypothesis). Every case must
end in our one-line error (raised from hf_vocabspec code) or load exactly what was saved.
"""

from __future__ import annotations

import json
import os
import struct
import traceback
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from tiny import VOCAB, llama_config
from transformers import LlamaForCausalLM

from hf_vocabspec import TokenCounts, TrimmedDrafter, trim_drafter
from hf_vocabspec.export import (
    load_eagle3_vocab_map,
    load_sglang_token_map,
    save_eagle3_vocab_map,
    to_sglang_token_map,
)
from hf_vocabspec.rdk import RDKKernel, identity_kernel

# fast and reproducible in the suite; HF_VOCABSPEC_FUZZ_EXAMPLES=500 for a longer, random hunt
_LONG = int(os.environ.get("HF_VOCABSPEC_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_LONG or 25, deadline=None, derandomize=not _LONG,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
# integers stay small enough that a config obeyed blindly cannot exhaust memory on a shared test machine
JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**5), st.floats(allow_nan=True),
                        st.text(max_size=20), st.lists(st.integers(-5, 100), max_size=4),
                        st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))


# --- mutations ------------------------------------------------------------------------------------------------------
def truncated(data: bytes, at: int) -> bytes:
    return data[: at % max(len(data), 1)]


def bit_flipped(data: bytes, at: int, bit: int) -> bytes:
    b = bytearray(data)
    b[at % len(b)] ^= 1 << (bit % 8)
    return bytes(b)


def safetensors_parts(data: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def with_header(header: dict, body: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


def edited_metadata(data: bytes, key_index: int, value) -> bytes:
    """Replace (or delete, for None) one __metadata__ field of a safetensors file."""
    header, body = safetensors_parts(data)
    meta = dict(header.get("__metadata__", {}))
    keys = sorted(meta)
    key = keys[key_index % len(keys)]
    if value is None:
        del meta[key]
    else:
        meta[key] = str(value)
    header["__metadata__"] = meta
    return with_header(header, body)


def edited_tensor_entry(data: bytes, key_index: int, field: str, value) -> bytes:
    """Edit one tensor's dtype/shape/offsets in a safetensors header (a file that lies about its tensors)."""
    header, body = safetensors_parts(data)
    names = sorted(k for k in header if k != "__metadata__")
    header[names[key_index % len(names)]][field] = value
    return with_header(header, body)


MUTATION = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 10**7)),
    st.tuples(st.just("flip"), st.integers(0, 10**7), st.integers(0, 7)),
    st.tuples(st.just("wrong-type"), st.sampled_from(["empty", "text", "json", "random", "other-ours"]),
              st.binary(min_size=1, max_size=64)),
)
HEADER_EDIT = st.one_of(
    st.tuples(st.just("metadata"), st.integers(0, 20), JSON_VALUES),
    st.tuples(st.just("dtype"), st.integers(0, 20), st.sampled_from(["F32", "F16", "I32", "I64", "BOOL", "U8", "XX"])),
    st.tuples(st.just("shape"), st.integers(0, 20), st.lists(st.integers(0, 200), max_size=3)),
)


def apply(data: bytes, mutation, other_ours: bytes) -> bytes:
    kind = mutation[0]
    if kind == "truncate":
        return truncated(data, mutation[1])
    if kind == "flip":
        return bit_flipped(data, mutation[1], mutation[2])
    if kind == "metadata":
        return edited_metadata(data, mutation[1], mutation[2])
    if kind in ("dtype", "shape"):
        return edited_tensor_entry(data, mutation[1], kind, mutation[2])
    what, noise = mutation[1], mutation[2]
    return {"empty": b"", "text": b"hello world\n", "json": b'{"counts": [1, 2, 3]}', "random": noise,
            "other-ours": other_ours}[what]


OUR_TYPES = (ValueError, OSError, TypeError, KeyError)


def ours(err: BaseException) -> bool:
    """Raised by a `raise` in hf_vocabspec code, one line (not a library's exception passing through). A C
    extension's error (SafetensorError, ...) leaves no frame of its own, so its type is checked too: ours are
    the builtin ValueError/OSError/TypeError/KeyError or classes of hf_vocabspec."""
    frames = traceback.extract_tb(err.__traceback__)
    raised_in = frames[-1].filename.replace("\\", "/") if frames else ""
    kind = type(err)
    our_type = kind in (ValueError, OSError, FileNotFoundError, TypeError, KeyError) or kind.__module__.startswith(
        "hf_vocabspec")
    one_line = len(str(err).strip().splitlines()) == 1
    return "/hf_vocabspec/" in raised_in and our_type and one_line and len(str(err)) < 800


def check(read, path: Path, data: bytes, expected_ok) -> None:
    path.write_bytes(data)
    try:
        loaded = read(path)
    except Exception as err:  # noqa: BLE001 - the point: which exceptions come out
        assert ours(err), f"library error passed through: {type(err).__name__}: {err}\n" + "".join(
            traceback.format_exception(err))[-3000:]
        return
    expected_ok(loaded)  # loaded: it must be exactly what was saved


# --- the files ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("ours")
    torch.manual_seed(0)
    counts = TokenCounts(torch.randint(0, 50, (VOCAB,)), 7, 9, "tiny", "a" * 64)
    counts.save(root / "counts.safetensors")
    drafter = trim_drafter(LlamaForCausalLM(llama_config()), torch.arange(3, 30))
    kernel = identity_kernel(drafter.d2t, VOCAB, num_targets=2)
    kernel.save(root / "kernel.safetensors")
    save_eagle3_vocab_map(drafter, root / "eagle3.safetensors")
    to_sglang_token_map(drafter, root / "hot.pt")
    rdk = trim_drafter(LlamaForCausalLM(llama_config()), torch.arange(3, 30))
    rdk.set_rdk_kernel(_moving_kernel(rdk))
    rdk.save_pretrained(root / "drafter")
    return {"root": root, "counts": counts, "drafter": rdk, "kernel": kernel}


def _moving_kernel(drafter) -> RDKKernel:
    """A kernel that moves some mass to pruned tokens (so edits of it matter)."""
    k = drafter.d2t.numel()
    pruned = torch.tensor([i for i in range(VOCAB) if i not in set(drafter.d2t.tolist())])
    targets = pruned[torch.arange(k * 2) % pruned.numel()].reshape(k, 2)
    weights = torch.tensor([[0.8, 0.15, 0.05]]).repeat(k, 1)
    return RDKKernel(drafter.d2t, targets, weights, VOCAB, "test")


@FUZZ
@given(mutation=st.one_of(MUTATION, HEADER_EDIT))
def test_counts_reader(files, tmp_path, mutation):
    src = files["root"] / "counts.safetensors"
    saved = files["counts"]

    def same(loaded):
        assert torch.equal(loaded.counts, saved.counts)
        assert (loaded.num_examples, loaded.num_assistant_turns, loaded.tokenizer_name, loaded.tokenizer_sha256) == (
            saved.num_examples, saved.num_assistant_turns, saved.tokenizer_name, saved.tokenizer_sha256)

    data = apply(src.read_bytes(), mutation, (files["root"] / "kernel.safetensors").read_bytes())
    check(TokenCounts.load, tmp_path / "c.safetensors", data, same)


@FUZZ
@given(mutation=st.one_of(MUTATION, HEADER_EDIT))
def test_rdk_kernel_reader(files, tmp_path, mutation):
    kernel = files["kernel"]

    def same(loaded):
        assert torch.equal(loaded.d2t, kernel.d2t) and torch.equal(loaded.targets, kernel.targets)
        assert torch.equal(loaded.weights, kernel.weights) and loaded.vocab_size == kernel.vocab_size

    data = apply((files["root"] / "kernel.safetensors").read_bytes(), mutation,
                 (files["root"] / "counts.safetensors").read_bytes())
    check(RDKKernel.load, tmp_path / "k.safetensors", data, same)


@FUZZ
@given(mutation=st.one_of(MUTATION, HEADER_EDIT))
def test_eagle3_vocab_map_reader(files, tmp_path, mutation):
    d2t = files["drafter"].d2t

    def same(loaded):
        assert torch.equal(loaded, d2t)

    data = apply((files["root"] / "eagle3.safetensors").read_bytes(), mutation,
                 (files["root"] / "counts.safetensors").read_bytes())
    check(load_eagle3_vocab_map, tmp_path / "m.safetensors", data, same)


@FUZZ
@given(mutation=MUTATION)
def test_sglang_token_map_reader(files, tmp_path, mutation):
    d2t = files["drafter"].d2t

    def same(loaded):
        assert torch.equal(loaded, d2t)

    data = apply((files["root"] / "hot.pt").read_bytes(), mutation, (files["root"] / "counts.safetensors").read_bytes())
    check(load_sglang_token_map, tmp_path / "hot.pt", data, same)


_TARGET = None


def _target():
    global _TARGET
    if _TARGET is None:
        torch.manual_seed(1)
        _TARGET = LlamaForCausalLM(llama_config()).eval()
        _TARGET.generation_config.pad_token_id = 0
    return _TARGET


def _drafter_same(saved: TrimmedDrafter):
    def same(loaded):
        """Loaded: the vocabulary map and sizes are the saved ones and the RDK kernel is a valid one, and the target's
        output with it is exactly its output alone. Weights (RDK kernel values included) carry no checksum: other
        weights only draft worse, verification keeps the output exact, which is what this checks."""
        assert torch.equal(loaded.d2t, saved.d2t)
        assert (loaded.config.vocab_size, loaded.config.draft_vocab_size) == (
            saved.config.vocab_size, saved.config.draft_vocab_size)
        assert loaded.lm_head.weight.shape == saved.lm_head.weight.shape
        assert loaded.rdk_targets.shape == saved.rdk_targets.shape
        loaded.validate_rdk_buffers()
        ids = torch.tensor([[1, 5, 6, 7]])
        target = _target()
        out = target.generate(ids, assistant_model=loaded, max_new_tokens=6, do_sample=False)
        assert torch.equal(out, target.generate(ids, max_new_tokens=6, do_sample=False))
    return same


def _copy_drafter(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())


@FUZZ
@given(mutation=st.one_of(MUTATION, HEADER_EDIT))
def test_drafter_weights_reader(files, tmp_path, mutation):
    where = tmp_path / "d"
    _copy_drafter(files["root"] / "drafter", where)
    data = apply((where / "model.safetensors").read_bytes(), mutation,
                 (files["root"] / "counts.safetensors").read_bytes())
    check(lambda _: TrimmedDrafter.from_pretrained(where), where / "model.safetensors", data,
          _drafter_same(files["drafter"]))


CONFIG_KEYS = ["vocab_size", "draft_vocab_size", "vocab_map_sha256", "drafter_config", "rdk", "model_type",
               "context_tokens", "tie_word_embeddings", "dtype", "drafter_config.vocab_size",
               "drafter_config.hidden_size", "drafter_config.model_type", "rdk.num_targets", "rdk.enabled"]


@FUZZ
@given(edit=st.one_of(
    st.tuples(st.just("key"), st.sampled_from(CONFIG_KEYS), JSON_VALUES),
    st.tuples(st.just("delete"), st.sampled_from(CONFIG_KEYS)),
    MUTATION,
))
def test_drafter_config_reader(files, tmp_path, edit):
    where = tmp_path / "d"
    _copy_drafter(files["root"] / "drafter", where)
    raw = (where / "config.json").read_bytes()
    if edit[0] in ("key", "delete"):
        cfg = json.loads(raw)
        *parents, leaf = edit[1].split(".")
        node = cfg
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return
        if edit[0] == "delete":
            node.pop(leaf, None)
        else:
            node[leaf] = edit[2]
        data = json.dumps(cfg).encode()
    else:
        data = apply(raw, edit, b"{}")
    check(lambda _: TrimmedDrafter.from_pretrained(where), where / "config.json", data,
          _drafter_same(files["drafter"]))


def test_fuzz_mutations_reach_the_data(files):
    """The mutations are not all caught by the header parse: a bit flip in a counts file's data loads in
    safetensors, and only our checksum refuses it."""
    data = (files["root"] / "counts.safetensors").read_bytes()
    flipped = bit_flipped(data, len(data) - 3, 1)
    header, _ = safetensors_parts(flipped)
    assert header == safetensors_parts(data)[0]
    state = load_file_bytes(flipped)
    assert not torch.equal(state["counts"], files["counts"].counts)


def load_file_bytes(data: bytes) -> dict:
    from safetensors.torch import load

    return load(data)


def test_save_file_roundtrip_of_fixture(files, tmp_path):
    """Sanity: the unmutated files load back exactly (the fuzz's 'loads correctly' branch is reachable)."""
    assert torch.equal(TokenCounts.load(files["root"] / "counts.safetensors").counts, files["counts"].counts)
    _drafter_same(files["drafter"])(TrimmedDrafter.from_pretrained(files["root"] / "drafter"))
    assert torch.equal(RDKKernel.load(files["root"] / "kernel.safetensors").weights, files["kernel"].weights)
    save_file(load_file(str(files["root"] / "kernel.safetensors")), str(tmp_path / "x.safetensors"))


# --- Optuna study files (--storage) of select and tune: resumed, or refused in one line ------------------------------
TEXT_MUTATION = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 10**7)),
    st.tuples(st.just("flip"), st.integers(0, 10**7), st.integers(0, 7)),
    st.tuples(st.just("digit"), st.integers(0, 10**7), st.sampled_from(b"0123456789")),
    st.tuples(st.just("wrong-type"), st.sampled_from(["empty", "text", "json", "random", "other-ours"]),
              st.binary(min_size=1, max_size=64)),
)


def apply_text(data: bytes, mutation, other_ours: bytes) -> bytes:
    if mutation[0] == "digit":  # an edited number: the likeliest hand edit of a journal
        b = bytearray(data)
        b[mutation[1] % len(b)] = mutation[2]
        return bytes(b)
    return apply(data, mutation, other_ours)


@pytest.fixture(scope="module")
def journals(tmp_path_factory):
    from tiny import toy_model

    from hf_vocabspec.cost import LatencyCurve
    from hf_vocabspec.selection import select_vocabulary, tune

    root = tmp_path_factory.mktemp("journals")
    v = 4096
    counts = TokenCounts((1e6 / torch.arange(1, v + 1).double() ** 1.1).long(), 100, 200, "zipf")
    curve = LatencyCurve([256, 1024, v], [0.010, 0.012, 0.020], 0.009)

    def select(storage):
        return select_vocabulary(counts, cost=curve, min_coverage=0.9, n_trials=8, storage=storage, k_range=(50, v))

    model = toy_model()

    def tuned(storage):
        return tune(model, n_trials=6, storage=storage, seed=1)

    select(root / "select.journal")
    tuned(root / "tune.journal")
    return {"root": root, "select": select, "tune": tuned, "counts": counts, "model": model}


@settings(FUZZ, max_examples=_LONG or 12)
@given(mutation=TEXT_MUTATION)
def test_selection_study_reader(journals, tmp_path, mutation):
    counts = journals["counts"]

    def valid(result):  # a resumed search: any feasible k in range, its value recomputed (never a stored one)
        assert 50 <= result.k <= 4096 and result.coverage >= 0.9 and result.coverage == counts.coverage(result.k)

    data = apply_text((journals["root"] / "select.journal").read_bytes(), mutation,
                      (journals["root"] / "tune.journal").read_bytes())
    check(journals["select"], tmp_path / "s.journal", data, valid)


@settings(FUZZ, max_examples=_LONG or 12)
@given(mutation=TEXT_MUTATION)
def test_tune_study_reader(journals, tmp_path, mutation):
    model = journals["model"]

    def valid(result):
        cell = (result.k, result.num_draft_tokens, result.context_tokens, result.confidence_threshold)
        assert cell in set(model.grid())
        assert result.tokens_per_second == model.tokens_per_second(*cell)
        assert all(v == model.tokens_per_second(k, n, c, t) for k, n, c, t, v in result.trials)

    data = apply_text((journals["root"] / "tune.journal").read_bytes(), mutation,
                      (journals["root"] / "select.journal").read_bytes())
    check(journals["tune"], tmp_path / "t.journal", data, valid)


@FUZZ
@given(mutation=MUTATION)
def test_load_drafter_reads_a_damaged_config_in_one_line(files, tmp_path, mutation):
    from hf_vocabspec import load_drafter

    where = tmp_path / "d"
    _copy_drafter(files["root"] / "drafter", where)
    data = apply((where / "config.json").read_bytes(), mutation, b"[1, 2]")
    check(lambda _: load_drafter(where), where / "config.json", data, _drafter_same(files["drafter"]))
