"""Bad input fails early, in ONE line that names the fix (issue #12): CLI arguments and exit codes, data files,
counts of another tokenizer, checkpoints, tokenizer/model and drafter/target mismatches, atomic saves."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import llama_config
from transformers import LlamaForCausalLM

import hf_vocabspec
from hf_vocabspec import (
    TokenCounts,
    TrimmedDrafter,
    VocabularyMapError,
    tokenizer_sha256,
    trim_drafter,
)
from hf_vocabspec.cli import build_parser, main
from hf_vocabspec.cost import LatencyCurve
from hf_vocabspec.evaluation.offline import (
    load_chat_dataset,
    load_model,
    load_tokenizer,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("offline:smollm2-135m-instruct")


@pytest.fixture(scope="module")
def same_size_other_tok(tok):
    """A different tokenizer with exactly as many tokens (two tokens swapped): sizes alone cannot tell."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    js = json.loads(tok.backend_tokenizer.to_str())
    vocab = js["model"]["vocab"]
    vocab["hello"], vocab["world"] = vocab["world"], vocab["hello"]
    other = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(js)), eos_token=tok.eos_token,
                                    bos_token=tok.bos_token)
    assert len(other) == len(tok) and tokenizer_sha256(other) != tokenizer_sha256(tok)
    return other


@pytest.fixture
def counts_file(tmp_path, tok):
    ds = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": f"hello world {i}"}]}
          for i in range(20)]
    counts = hf_vocabspec.count_assistant_tokens(ds, tok, progress=False)
    assert counts.tokenizer_sha256 == tokenizer_sha256(tok)
    path = tmp_path / "counts.safetensors"
    counts.save(path)
    return path


def run_cli(capsys, *argv) -> tuple[int, str]:
    try:
        rc = main(list(argv))
    except SystemExit as exit_:
        rc = exit_.code
    err = capsys.readouterr().err
    return rc, err


def _last_line(err: str) -> str:
    return [ln for ln in err.strip().splitlines() if ln.strip()][-1]


# --- command line -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "needle"), [
    (["trim", "--min-coverage", "1.5"], "--min-coverage: must be in (0, 1]"),
    (["select", "--counts", "c", "--min-coverage", "0"], "--min-coverage: must be in (0, 1]"),
    (["trim", "--min-coverage", "abc"], "expected a number in (0, 1]"),
    (["count", "--max-examples", "0"], "--max-examples: must be a positive integer"),
    (["trim", "--max-examples", "-3"], "--max-examples: must be a positive integer"),
    (["trim", "--k", "0"], "--k: must be a positive integer"),
    (["select"], "the following arguments are required: --counts"),
    (["trim", "--private"], "only apply with --push-to-hub"),
    (["count", "--output", "/nonexistent-dir-xyz/counts.safetensors"], "does not exist"),
])
def test_usage_errors_are_one_line_exit_2_before_any_work(capsys, monkeypatch, argv, needle):
    import hf_vocabspec.cli._common as common

    monkeypatch.setattr(common, "count_for_args", lambda args: pytest.fail("worked before checking the arguments"))
    rc, err = run_cli(capsys, *argv)
    assert rc == 2
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err


def test_every_option_has_help_with_its_default():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, p in sub.choices.items():
        assert isinstance(p.formatter_class, type) and issubclass(p.formatter_class, argparse.ArgumentDefaultsHelpFormatter)
        missing += [f"{name} {a.option_strings[0]}" for a in p._actions
                    if a.option_strings and a.option_strings[0] != "-h" and not a.help]
    assert not missing
    assert "(default: 5000)" in " ".join(sub.choices["trim"].format_help().split())


def test_later_errors_are_one_line_and_debug_shows_the_traceback(capsys, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    rc, err = run_cli(capsys, "count", "--dataset", str(tmp_path / "empty.jsonl"), "--output", str(tmp_path / "c"))
    assert rc == 1 and "is empty" in err and "Traceback" not in err and "--debug" in err
    with pytest.raises(ValueError, match="is empty"):
        main(["--debug", "count", "--dataset", str(tmp_path / "empty.jsonl"), "--output", str(tmp_path / "c")])


def test_cli_process_exit_code_and_single_line(tmp_path):
    """The real entry point in a fresh process: one line on stderr, exit 2, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "hf_vocabspec.cli", "trim", "--min-coverage", "2"], cwd=tmp_path,
                          capture_output=True, text=True, check=False, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# --- data -----------------------------------------------------------------------------------------------------
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


@pytest.mark.parametrize("name", ["chats.jsonl", "chats.json", "chats.jsonl.gz", "chats.csv"])
def test_a_chat_file_that_is_not_utf8_is_named_with_its_fix(capsys, cli_model, tmp_path, name):
    """Issue #38: latin-1 bytes gave "'utf-8' codec can't decode byte 0xe9 in position 3" with no file and no fix
    (datasets' JSON reader loads the bytes and fails only when a row is read). `count` through the CLI: one line naming
    the file, the byte, its offset and line, and the iconv command; exit 1, no traceback."""
    import gzip

    model, _ = cli_model
    good = '{"messages": [{"role": "user", "content": "w5 w6"}, {"role": "assistant", "content": "w7 w8"}]}\n'
    bad = '{"messages": [{"role": "user", "content": "caf\u00e9"}, {"role": "assistant", "content": "w7"}]}\n'
    text = (good + bad).encode("latin-1")
    if name.endswith(".csv"):
        text = "messages\nw5 w6\ncaf\u00e9\n".encode("latin-1")
    data = tmp_path / name
    data.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    offset = text.index(b"\xe9")
    rc, err = run_cli(capsys, "count", "--tokenizer", str(model), "--dataset", str(data),
                      "--output", str(tmp_path / "counts.safetensors"))
    assert rc == 1 and "Traceback" not in err
    line = _last_line(err)
    assert f"Dataset file {str(data)!r} is not UTF-8 (byte 0xe9 at offset {offset}" in line
    lineno = text[:offset].count(b"\n") + 1
    assert f"line {lineno})" in line and "iconv -f latin1 -t utf-8" in line
    assert not (tmp_path / "counts.safetensors").exists()


def test_check_utf8_offsets_across_chunks(tmp_path):
    """The offset is the file's, also past the 1 MiB read chunks and with a character split between two of them."""
    from hf_vocabspec._io import check_utf8

    head = b"x" * ((1 << 20) - 1) + "\u00e9\n".encode()  # a 2-byte character across the chunk boundary: valid
    ok = tmp_path / "ok.jsonl"
    ok.write_bytes(head + "\u20ac\n".encode())
    check_utf8(ok)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(head + b"ab\xe9cd\n")
    with pytest.raises(ValueError, match=rf"byte 0xe9 at offset {len(head) + 2}, line 2\)"):
        check_utf8(bad)
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"abc" + "\u20ac".encode()[:2])  # ends in the middle of a character
    with pytest.raises(ValueError, match="byte 0xe2 at offset 3, line 1"):
        check_utf8(cut)


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


# --- tokenizers ---------------------------------------------------------------------------------------------------
def test_counts_refuse_another_tokenizer_of_the_same_size(counts_file, tok, same_size_other_tok):
    counts = TokenCounts.load(counts_file)
    counts.check_tokenizer(tok)
    with pytest.raises(ValueError, match="fingerprints differ"):
        counts.check_tokenizer(same_size_other_tok)
    with pytest.raises(ValueError, match="different tokenizers"):
        counts + TokenCounts(counts.counts, 1, 1, counts.tokenizer_name, "0" * 64)


def test_select_refuses_other_tokenizer_before_loading_or_timing(capsys, monkeypatch, tmp_path, counts_file,
                                                                 same_size_other_tok):
    from hf_vocabspec import cost
    from hf_vocabspec.evaluation import offline

    same_size_other_tok.save_pretrained(tmp_path / "other-tok")
    monkeypatch.setattr(offline, "load_model", lambda *a, **k: pytest.fail("loaded the model before the check"))
    monkeypatch.setattr(cost, "measure_draft_latency", lambda *a, **k: pytest.fail("timed before the check"))
    for cmd in (["select", "--counts", str(counts_file), "--drafter", str(tmp_path / "other-tok")],
                ["trim", "--counts", str(counts_file), "--drafter", str(tmp_path / "other-tok")]):
        rc, err = run_cli(capsys, *cmd, "--output", str(tmp_path / "out"))
        assert rc == 1 and "fingerprints differ" in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "out").exists()


def test_unreachable_coverage_refused_before_timing_and_leaves_no_folder(capsys, monkeypatch, tmp_path, counts_file):
    from hf_vocabspec.evaluation import offline

    monkeypatch.setattr(offline, "load_model", lambda *a, **k: pytest.fail("loaded the model before the check"))
    counts = TokenCounts.load(counts_file)
    flat = TokenCounts(torch.ones_like(counts.counts), 1, 1, counts.tokenizer_name, counts.tokenizer_sha256)
    flat.save(tmp_path / "flat.safetensors")  # every token once: the top 50 cover 50/49,152
    rc, err = run_cli(capsys, "select", "--counts", str(tmp_path / "flat.safetensors"), "--min-coverage", "0.99",
                      "--max-k", "50", "--output", str(tmp_path / "sel"))
    assert rc == 2 and "unreachable" in err and "best reachable coverage" in err
    assert not (tmp_path / "sel").exists()


def test_trim_drafter_refuses_a_tokenizer_of_another_model(tok, same_size_other_tok):
    small = LlamaForCausalLM(llama_config())
    with pytest.raises(ValueError, match="has 49152 tokens but the drafter's embedding has only 64 rows"):
        trim_drafter(small, torch.arange(3, 30), tokenizer=tok)
    big = LlamaForCausalLM(llama_config(vocab_size=len(tok) + 4096))
    with pytest.raises(ValueError, match="more than padding"):
        trim_drafter(big, torch.arange(3, 30), tokenizer=tok)
    wrong_eos = LlamaForCausalLM(llama_config(vocab_size=len(tok), eos_token_id=7, bos_token_id=tok.bos_token_id))
    with pytest.raises(ValueError, match="EOS id"):
        trim_drafter(wrong_eos, torch.arange(3, 30), tokenizer=tok)
    ok = LlamaForCausalLM(llama_config(vocab_size=len(tok), eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                                       pad_token_id=tok.pad_token_id))
    trim_drafter(ok, torch.arange(3, 30), tokenizer=tok)


def test_generate_mismatch_gets_our_error_not_universal_assisted_decoding(tok, same_size_other_tok):
    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config(vocab_size=len(tok), eos_token_id=tok.eos_token_id,
                                          bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id)).eval()
    drafter = trim_drafter(model, torch.arange(3, 300), tokenizer=tok)
    ids = torch.tensor([[1, 5, 6]])
    with pytest.raises(VocabularyMapError, match="fingerprints differ") as err:
        model.generate(ids, assistant_model=drafter, tokenizer=same_size_other_tok, max_new_tokens=3)
    assert "universal" not in str(err.value).lower()
    model.generate(ids, assistant_model=drafter, tokenizer=tok, max_new_tokens=3)  # the right one passes
    # fewer rows than the drafter's ids (a target padded past the tokenizer, MORE rows, is compatible)
    other_target = LlamaForCausalLM(llama_config(vocab_size=len(tok) - 64)).eval()
    with pytest.raises(VocabularyMapError, match="must share a tokenizer") as err:
        other_target.generate(ids, assistant_model=drafter, max_new_tokens=3)
    assert "universal" not in str(err.value).lower()
    with pytest.raises(ValueError, match="num_assistant_tokens must be a positive integer"):
        model.generate(ids, assistant_model=drafter, num_assistant_tokens=0, max_new_tokens=3)


# --- checkpoints ----------------------------------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    drafter = trim_drafter(LlamaForCausalLM(llama_config()), torch.arange(3, 30))
    drafter.save_pretrained(tmp_path / "d")
    return drafter, tmp_path / "d"


def test_checkpoint_errors(saved, tmp_path):
    _, path = saved
    weights = path / "model.safetensors"
    state = load_file(str(weights))
    state["d2t"][4] = -5
    save_file(state, str(weights), metadata={"format": "pt"})
    with pytest.raises(VocabularyMapError, match="negative target id -5 at draft position 4"):
        TrimmedDrafter.from_pretrained(path)
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(OSError, match="truncated or corrupt"):
        TrimmedDrafter.from_pretrained(path)
    (path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        TrimmedDrafter.from_pretrained(path)


def test_save_pretrained_is_atomic_and_keeps_other_files(saved, monkeypatch):
    drafter, path = saved
    (path / "tokenizer.json").write_text("{}")
    before = {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}

    def broken(self, directory, *args, **kwargs):
        (Path(directory) / "config.json").write_text("{}")  # half written, then interrupted
        raise KeyboardInterrupt

    monkeypatch.setattr(TrimmedDrafter.__mro__[1], "save_pretrained", broken)
    with pytest.raises(KeyboardInterrupt):
        drafter.save_pretrained(path)
    assert {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()} == before  # the old one, whole
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []  # no temp left
    with pytest.raises(KeyboardInterrupt):
        drafter.save_pretrained(path.parent / "new")
    assert not (path.parent / "new").exists()  # nothing, never a config without weights
    monkeypatch.undo()
    drafter.save_pretrained(path)
    assert (path / "tokenizer.json").read_text() == "{}"
    assert torch.equal(TrimmedDrafter.from_pretrained(path).d2t, drafter.d2t)


# --- noisy latency curve -----------------------------------------------------------------------------------------
def test_implausible_latency_curve_is_remeasured_then_replaced_by_flops():
    from hf_vocabspec.cli.pipeline import measured_or_flops

    good = LatencyCurve([1024, 49152], [0.020, 0.026], 0.018)
    noisy = LatencyCurve([1024, 49152], [0.030, 0.026], 0.018)  # k=1,024 slower than the full head
    below_floor = LatencyCurve([1024, 49152], [0.020, 0.015], 0.018)  # full head cheaper than the body alone
    assert good.implausibility() is None
    assert "slower than k=49152" in noisy.implausibility()
    assert "faster than the body alone" in below_floor.implausibility()
    model = LlamaForCausalLM(llama_config())
    seq = iter([noisy, good])
    cost, curve, note = measured_or_flops(model, [1024], measure=lambda m, ks: next(seq))
    assert curve is good and cost is good and "second measurement" in note
    seq = iter([noisy, below_floor])
    cost, curve, note = measured_or_flops(model, [1024], measure=lambda m, ks: next(seq))
    assert curve is None and cost is model.config and note.startswith("FLOPs model")


def test_import_hands_out_the_pipeline_lazily():
    code = ("import sys, hf_vocabspec as h; heavy = [m for m in ('optuna', 'matplotlib') if m in sys.modules]; "
            "assert not heavy, heavy; "
            "[getattr(h, n) for n in h.__all__]; h.selection.select_vocabulary; h.cost.measure_draft_latency; "
            "assert h.coverage.TokenCounts is h.TokenCounts; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


def test_missing_counts_file_and_drafter_dir(capsys, tmp_path):
    rc, err = run_cli(capsys, "select", "--counts", str(tmp_path / "missing.safetensors"))
    assert rc == 1 and "No such counts file" in err and len(err.strip().splitlines()) == 1
    rc, err = run_cli(capsys, "rdk-fit", "./no-such-drafter")
    assert rc == 1 and "No such drafter directory: './no-such-drafter'" in err and "Repo id" not in err


# --- issue #21: never delete what we did not write ------------------------------------------------------------------
def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under root with its bytes (None for folders): equal trees = nothing created, changed or deleted."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if a command loads a model, a dataset or counts anything."""
    import hf_vocabspec.cli._common as common
    from hf_vocabspec.evaluation import offline

    def fail(*a, **k):
        pytest.fail("loaded a model/dataset before the command line was known to be valid")

    monkeypatch.setattr(offline, "load_model", fail)
    monkeypatch.setattr(offline, "load_chat_dataset", fail)
    monkeypatch.setattr(common, "count_for_args", fail)


@pytest.fixture
def user_folder(tmp_path):
    (tmp_path / "results.txt").write_text("not JSON")
    folder = tmp_path / "project"
    (folder / "src").mkdir(parents=True)
    (folder / "notes.txt").write_text("my notes")
    (folder / "src" / "main.py").write_text("print('mine')")
    return folder


def test_trim_refuses_an_output_folder_it_did_not_write(capsys, no_loading, user_folder, tmp_path):
    before = _tree(tmp_path)
    rc, err = run_cli(capsys, "trim", "--k", "100", "--output", str(user_folder))
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "not an earlier hf-vocabspec drafter output" in err and "notes.txt" in err and "--overwrite" in err
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("argv", [
    ["trim", "--k", "100"], ["select", "--counts", "c.safetensors"], ["bench"], ["acceptance"], ["tune"],
    ["demo"], ["rdk-bench"], ["distill"], ["rdk-fit", "d", "--output"],
])
def test_output_naming_a_regular_file_is_refused(capsys, no_loading, tmp_path, argv):
    existing = tmp_path / "results.txt"
    existing.write_text("keep me")
    before = _tree(tmp_path)
    if argv[-1] != "--output":
        argv = [*argv, "--output"]
    rc, err = run_cli(capsys, *argv, str(existing))
    assert rc == 2 and "is a file, not a folder" in err and len(err.strip().splitlines()) == 1, err
    assert _tree(tmp_path) == before


def test_count_output_must_be_a_counts_file_or_new(capsys, no_loading, tmp_path, counts_file):
    other = tmp_path / "data.safetensors"
    save_file({"x": torch.zeros(2)}, str(other))
    before = _tree(tmp_path)
    rc, err = run_cli(capsys, "count", "--output", str(other))
    assert rc == 2 and "is not an hf-vocabspec counts file" in err and "--overwrite" in err, err
    rc, err = run_cli(capsys, "count", "--output", str(tmp_path))
    assert rc == 2 and "is a folder" in err, err
    assert _tree(tmp_path) == before
    from hf_vocabspec.cli._common import prepare_output

    assert prepare_output(str(counts_file), "counts") == counts_file  # our own earlier counts: replaced atomically
    assert prepare_output(str(other), "counts", overwrite=True) == other


def test_an_earlier_output_of_ours_is_accepted_and_anything_added_refused(saved, tok, tmp_path):
    from hf_vocabspec.cli._common import UsageError, prepare_output

    _, path = saved
    tok.save_pretrained(path)
    (path / "custom_generate").mkdir()
    (path / "custom_generate" / "generate.py").write_text("")
    assert prepare_output(str(path), "drafter") == path
    (tmp_path / "empty").mkdir()
    assert prepare_output(str(tmp_path / "empty"), "drafter") == tmp_path / "empty"
    (path / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="it holds notes.txt"):
        prepare_output(str(path), "drafter")
    assert prepare_output(str(path), "drafter", overwrite=True) == path
    bench = tmp_path / "bench"
    bench.mkdir()
    for name in ("results.json", "results.md", "throughput_vs_vocab.png"):
        (bench / name).write_text("{}")
    assert prepare_output(str(bench), "bench") == bench
    with pytest.raises(UsageError, match="not an earlier hf-vocabspec tune output"):
        prepare_output(str(bench), "tune")


def test_save_pretrained_keeps_every_file_it_did_not_write(saved):
    drafter, path = saved
    mine = {"notes.txt": b"n", "helper.py": b"x = 1", "embeddings.safetensors": b"not ours", "src/main.py": b"m"}
    for name, data in mine.items():
        (path / name).parent.mkdir(exist_ok=True)
        (path / name).write_bytes(data)
    (path / "model-00001-of-00002.safetensors").write_bytes(b"stale shard of an earlier save")
    (path / "model.safetensors.index.json").write_text("{}")
    drafter.save_pretrained(path)
    for name, data in mine.items():
        assert (path / name).read_bytes() == data, name
    assert not (path / "model-00001-of-00002.safetensors").exists()  # only our own stale weights go
    assert not (path / "model.safetensors.index.json").exists()
    assert torch.equal(TrimmedDrafter.from_pretrained(path).d2t, drafter.d2t)


# --- issue #21: crashes ---------------------------------------------------------------------------------------------
def test_trim_k_beyond_the_vocabulary_is_refused_before_loading(capsys, no_loading, tmp_path, counts_file):
    for extra in ([], ["--counts", str(counts_file)]):
        rc, err = run_cli(capsys, "trim", "--k", "100000", *extra, "--output", str(tmp_path / "out"))
        assert rc == 2 and "--k 100000 is beyond the vocabulary (49,152 tokens)" in err, err
        assert not (tmp_path / "out").exists()


@pytest.fixture
def bf16_saved(tmp_path):
    """A drafter trimmed from a bf16 base whose config says bfloat16 (as a real bf16 checkpoint's does)."""
    from tiny import make_pair

    target, base = make_pair()
    base = base.to(torch.bfloat16)
    base.config.dtype = base.model.config.dtype = torch.bfloat16
    trim_drafter(base, torch.arange(3, 40)).save_pretrained(tmp_path / "bf16")
    return target, tmp_path / "bf16"


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_from_pretrained_dtype_converts_the_whole_drafter(bf16_saved, dtype):
    target, path = bf16_saved
    drafter = TrimmedDrafter.from_pretrained(path, dtype=dtype)
    assert {p.dtype for p in drafter.parameters()} == {dtype}  # body AND head
    ids = torch.tensor([[1, 5, 6, 7]])
    out = target.generate(ids, assistant_model=drafter, max_new_tokens=8, do_sample=False)
    assert torch.equal(out, target.generate(ids, max_new_tokens=8, do_sample=False))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_drafter_dtype_other_than_the_target_s(dtype, kind):
    """A half-precision drafter for an fp32 target: greedy output identical to target-only, sampling runs."""
    from tiny import make_pair

    target, base = make_pair(kind)
    drafter = trim_drafter(base.to(dtype), torch.arange(3, 40))
    ids = torch.tensor([[1, 5, 6, 7, 9]])
    for context_tokens in (False, True) if drafter.supports_context_tokens else (False,):
        drafter.use_context_tokens = context_tokens
        out = target.generate(ids, assistant_model=drafter, max_new_tokens=12, do_sample=False)
        assert torch.equal(out, target.generate(ids, max_new_tokens=12, do_sample=False))
        torch.manual_seed(0)
        sampled = target.generate(ids, assistant_model=drafter, max_new_tokens=12, do_sample=True)
        assert sampled.shape[1] > ids.shape[1]


# --- issue #21: accepted silently -------------------------------------------------------------------------------
def test_assistant_turns_without_content_are_not_turns(tok):
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": content}]}
            for content in (None, "", "  \n")]
    rows.append({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]})
    counts = hf_vocabspec.count_assistant_tokens(rows, tok, progress=False)
    assert counts.num_assistant_turns == 1
    assert counts.num_tokens == len(tok("hello there", add_special_tokens=False)["input_ids"]) + 1  # + end marker
    with pytest.raises(ValueError, match="No assistant turns"):
        hf_vocabspec.count_assistant_tokens(rows[:3], tok, progress=False)


@pytest.mark.parametrize(("argv", "needle"), [
    (["--counts", "C", "--dataset", "offline:sharegpt"], "--counts and --dataset contradict"),
    (["--counts", "C", "--max-examples", "10"], "--counts and --max-examples contradict"),
    (["--k", "3000", "--min-coverage", "0.99"], "--k and --min-coverage contradict"),
    (["--k", "3000", "--n-trials", "5", "--objective", "utility"], "--k and --objective, --n-trials contradict"),
])
def test_trim_contradictions_are_refused(capsys, no_loading, tmp_path, argv, needle):
    rc, err = run_cli(capsys, "trim", *argv, "--output", str(tmp_path / "out"))
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_trim_target_of_another_tokenizer_is_refused_before_work(capsys, no_loading, tmp_path, same_size_other_tok):
    same_size_other_tok.save_pretrained(tmp_path / "other-target")
    rc, err = run_cli(capsys, "trim", "--k", "100", "--target", str(tmp_path / "other-target"),
                      "--output", str(tmp_path / "out"))
    assert rc == 2 and "uses another tokenizer than the drafter" in err and "fingerprints differ" in err, err
    assert not (tmp_path / "out").exists()


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


class safe_open_meta:  # noqa: N801 - a tiny context manager: (tensors, metadata) of a safetensors file
    def __init__(self, path):
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            self.value = ({k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {}))

    def __enter__(self):
        return self.value

    def __exit__(self, *exc):
        return False


# --- issue #21: late -- every option of every command checked before any model, dataset or folder ---------------
SMOL = "offline:smollm2-135m-instruct"
REFUSED = [
    ("count", ["--max-examples", "0"]),
    ("count", ["--dataset", "./no/such/file.jsonl"]),
    ("trim", ["--k", "100000"]),
    ("trim", ["--k", "10", "--min-coverage", "0.9"]),
    ("select", ["--counts", "c", "--n-trials", "0"]),
    ("rdk-fit", ["d", "--temperature", "0"]),
    ("rdk-fit", ["d", "--method", "prior", "--sequences", "5"]),
    ("demo", ["--prompts", "0"]),
    ("demo", ["--min-coverage", "1.5"]),
    ("bench", ["--coverages", "1.5"]),
    ("bench", ["--prompts", "0"]),
    ("bench", ["--max-new-tokens", "0"]),
    ("bench", ["--repeats", "0"]),
    ("bench", ["--target", SMOL, "--ks", "100000"]),
    ("bench", ["--coverages"]),
    ("bench", ["--workloads", "./no/such.jsonl"]),
    ("acceptance", ["--conversations", "0"]),
    ("acceptance", ["--levels", "1.0"]),
    ("acceptance", ["--temperatures", "0"]),
    ("rdk-bench", ["--score-sequences", "0"]),
    ("rdk-bench", ["--no-generate", "--prompts", "5"]),
    ("distill", ["--num-layers", "0"]),
    ("distill", ["--lr", "-1"]),
    ("tune", ["--draft-lengths", "0"]),
    ("tune", ["--mode", "t-1"]),
    ("tune", ["--mode", "hot"]),
    ("tune", ["--coverages", "1.5"]),
    ("tune", ["--conversations", "0"]),
    ("tune", ["--target", SMOL, "--ks", "100000"]),
    ("tune", ["--ks", "100", "--coverages", "0.9"]),
    ("tune", ["--validate-on", "scored"]),
    ("tune", ["--storage", "results.txt/study.journal"]),
    ("select", ["--counts", "c", "--storage", "."]),
    ("select", ["--counts", "c", "--max-k", "10"]),
    ("trim", ["--max-k", "10"]),
    ("bench", ["--target", "./no/such/model"]),
    ("acceptance", ["--target", "offline:no-such-model"]),
    ("tune", ["--drafter", "results.txt"]),
    ("rdk-bench", ["--target", "./no/such/model"]),
    ("distill", ["--target", "./no/such/model"]),
    ("trim", ["--k", "10", "--push-to-hub", "u/r", "--bench-results", "results.txt"]),
    ("lm-eval", ["run", "--model", "hf-vocabspec", "--model_args", "pretrained=./no/such/model", "--tasks", "x"]),
    ("lm-eval", ["run", "--model", "hf-vocabspec", "--model_args", "drafter=d", "--tasks", "x"]),
]


@pytest.mark.parametrize(("command", "argv"), REFUSED, ids=[f"{c} {' '.join(a)}" for c, a in REFUSED])
@pytest.mark.parametrize("output", ["default", "given"])
def test_nothing_is_created_or_deleted_when_a_command_is_refused(capsys, monkeypatch, no_loading, tmp_path,
                                                                 user_folder, command, argv, output):
    monkeypatch.chdir(tmp_path)
    if output == "given":
        argv = [*argv, "--output", str(tmp_path / "out" / "run")]
    before = _tree(tmp_path)
    rc, err = run_cli(capsys, command, *argv)
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert _tree(tmp_path) == before


def test_every_command_is_covered_by_the_refusal_test():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) <= {c for c, _ in REFUSED}


# --- issue #21: unclear dataset errors ----------------------------------------------------------------------------
def test_unreadable_datasets_name_the_file_the_line_and_the_format(capsys, tmp_path):
    ok = json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
    (tmp_path / "notjson.json").write_text("hello world\n")
    (tmp_path / "broken.jsonl").write_text(f"{ok}\n{ok}\n{{\"messages\": [broken\n{ok}\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "readme.txt").write_text("hi")
    cases = [("notjson.json", "line 1"), ("broken.jsonl", "line 3"), ("folder", "holds no .json/.jsonl")]
    for name, where in cases:
        rc, err = run_cli(capsys, "count", "--dataset", str(tmp_path / name), "--output", str(tmp_path / "c.safetensors"))
        line = _last_line(err)  # (after datasets' progress bar, which a terminal overwrites)
        assert rc == 1 and "Traceback" not in err and "Failed to load JSON" not in err, err
        assert str(tmp_path / name) in line and where in line and "'messages' list" in line, err
        assert "An error occurred while generating" not in err
    assert not (tmp_path / "c.safetensors").exists()


def test_drafter_of_another_tokenizer_is_refused_before_loading(capsys, no_loading, tmp_path, same_size_other_tok):
    same_size_other_tok.save_pretrained(tmp_path / "other")
    for command in ("bench", "tune", "demo"):
        rc, err = run_cli(capsys, command, "--target", SMOL, "--drafter", str(tmp_path / "other"),
                          "--output", str(tmp_path / "out"))
        assert rc == 2 and "--drafter" in err and "fingerprints differ" in err, err
        assert not (tmp_path / "out").exists()


def test_a_folder_for_a_file_and_a_file_for_a_folder(tmp_path, saved):
    with pytest.raises(ValueError, match="is a folder, not a counts file"):
        TokenCounts.load(tmp_path)
    _, path = saved
    with pytest.raises(FileNotFoundError, match="is a file: pass the folder"):
        TrimmedDrafter.from_pretrained(path / "model.safetensors")
    LlamaForCausalLM(llama_config()).save_pretrained(tmp_path / "plain")
    with pytest.raises(OSError, match="is not a trimmed drafter .*model_type 'llama'"):
        TrimmedDrafter.from_pretrained(tmp_path / "plain")


def test_a_run_that_fails_later_leaves_no_empty_folders(capsys, monkeypatch, tmp_path):
    """Found after the checks (a model that cannot be loaded): the folders made for --output are removed again."""
    from hf_vocabspec.evaluation import offline

    def broken(*a, **k):
        raise OSError("cannot load this model")

    monkeypatch.setattr(offline, "load_model", broken)
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": f"hello {i}"}]}
            for i in range(150)]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = _tree(tmp_path)
    rc, err = run_cli(capsys, "acceptance", "--target", SMOL, "--dataset", str(tmp_path / "chat.jsonl"),
                      "--count-examples", "20", "--output", str(tmp_path / "results" / "acceptance"))
    assert rc == 1 and "cannot load this model" in _last_line(err), err
    assert _tree(tmp_path) == before


def test_python_api_file_writers_refuse_a_folder(tmp_path, counts_file, saved):
    from hf_vocabspec.export import to_sglang_token_map

    drafter, _ = saved
    with pytest.raises(IsADirectoryError, match="is a folder: pass a file name"):
        TokenCounts.load(counts_file).save(tmp_path)
    with pytest.raises(IsADirectoryError, match="is a folder: pass a file name"):
        to_sglang_token_map(drafter, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_checkpoint_check_accepts_architectures_with_other_field_names(tmp_path):
    """GPT-2 spells hidden_size/num_hidden_layers n_embd/n_layer: the config-vs-weights check must not refuse it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=1,
                                      eos_token_id=2)).eval()
    drafter = trim_drafter(base, torch.arange(3, 30))
    drafter.save_pretrained(tmp_path / "gpt2")
    loaded = TrimmedDrafter.from_pretrained(tmp_path / "gpt2", dtype=torch.float16)
    assert torch.equal(loaded.d2t, drafter.d2t) and {p.dtype for p in loaded.parameters()} == {torch.float16}


# --- issue #29: silently ignored or lost ----------------------------------------------------------------------------
def test_batched_speculation_survives_save_and_load_and_one_home(tmp_path):
    from hf_vocabspec import configuration
    from hf_vocabspec.generation import engine

    assert engine.SPECULATION_MODES is configuration.SPECULATION_MODES  # one home of the valid values
    torch.manual_seed(0)
    drafter = trim_drafter(LlamaForCausalLM(llama_config()), torch.arange(3, 30))
    for value in ("off", "on", "auto"):
        drafter.generation_config.batched_speculation = value
        drafter.save_pretrained(tmp_path / value)
        assert TrimmedDrafter.from_pretrained(tmp_path / value).generation_config.batched_speculation == value
    # saved before the fix: transformers drops unknown fields of a file marked _from_model_config
    gen = tmp_path / "off" / "generation_config.json"
    gen.write_text(json.dumps(json.loads(gen.read_text()) | {"_from_model_config": True}))
    assert TrimmedDrafter.from_pretrained(tmp_path / "off").generation_config.batched_speculation == "off"


@pytest.mark.parametrize(("setting", "value", "needle"), [
    ("num_assistant_tokens", 0, "drafter.generation_config.num_assistant_tokens must be a positive integer (got 0)"),
    ("num_assistant_tokens", -2, "drafter.generation_config.num_assistant_tokens must be a positive integer (got -2)"),
    ("assistant_confidence_threshold", 1.5,
     "drafter.generation_config.assistant_confidence_threshold must be in [0, 1)"),
    ("assistant_confidence_threshold", 1.0,
     "drafter.generation_config.assistant_confidence_threshold must be in [0, 1)"),
    ("assistant_confidence_threshold", -0.1,
     "drafter.generation_config.assistant_confidence_threshold must be in [0, 1)"),
])
def test_drafting_settings_out_of_range_are_refused_on_the_drafter_and_in_generate(tmp_path, setting, value, needle):
    """Issue #38: a draft length or confidence threshold outside its range is refused in one line wherever it is set:
    on the drafter's own generation_config (was: drafted 5 per round / stopped every round after one draft without a
    word), passed to generate(), and on save."""
    from tiny import make_pair

    target, base = make_pair()
    drafter = trim_drafter(base, torch.arange(3, 40))
    ids = torch.tensor([[1, 5, 6]])
    setattr(drafter.generation_config, setting, value)
    for batch in (ids, ids.repeat(2, 1)):
        with pytest.raises(ValueError) as err:
            target.generate(batch, attention_mask=torch.ones_like(batch), assistant_model=drafter, max_new_tokens=3,
                            do_sample=False)
        assert needle in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="must be") as err:
        drafter.save_pretrained(tmp_path / "d")
    assert needle in str(err.value) and not (tmp_path / "d").exists()
    setattr(drafter.generation_config, setting, {"num_assistant_tokens": 4, "assistant_confidence_threshold": 0.3}[setting])
    with pytest.raises(ValueError) as err:  # passed to generate(): refused under its own name
        target.generate(ids, assistant_model=drafter, max_new_tokens=3, do_sample=False, **{setting: value})
    assert needle.removeprefix("drafter.generation_config.") in str(err.value)
    assert "drafter.generation_config" not in str(err.value)
    target.generate(ids, assistant_model=drafter, max_new_tokens=3, do_sample=False)  # in range: runs


def test_confidence_threshold_range_is_zero_up_to_one_excluded():
    from hf_vocabspec.configuration import check_confidence_threshold

    assert check_confidence_threshold(0) == 0.0 and check_confidence_threshold("0.99") == 0.99
    for bad in (1, 1.5, -0.01, float("nan"), "x", None):
        with pytest.raises(ValueError, match=r"must be in \[0, 1\)"):
            check_confidence_threshold(bad, name="x")


@pytest.mark.parametrize(("kwarg", "value", "fix"), [
    ("batched_speculation", "off", "set drafter.generation_config.batched_speculation = 'off'"),
    ("use_context_tokens", False, "set drafter.use_context_tokens = False"),
    ("use_fast_linears", False, "set drafter.use_fast_linears = False"),
    ("weight_quantization", "int4", "call drafter.quantize_weights('int4')"),
])
def test_drafter_settings_passed_to_generate_name_where_they_live(kwarg, value, fix):
    """Issue #38: transformers only said "model_kwargs are not used"; the one line now names the drafter setting."""
    from tiny import make_pair

    target, base = make_pair()
    drafter = trim_drafter(base, torch.arange(3, 40))
    with pytest.raises(ValueError) as err:
        target.generate(torch.tensor([[1, 5, 6]]), assistant_model=drafter, max_new_tokens=3, **{kwarg: value})
    assert str(err.value) == f"{kwarg} is a drafter setting, not a generate() argument: {fix} before generate()."
    with pytest.raises(ValueError, match="model_kwargs` are not used"):  # other unknown kwargs: transformers' own
        target.generate(torch.tensor([[1, 5, 6]]), assistant_model=drafter, max_new_tokens=3, not_a_setting=1)


def test_invalid_batched_speculation_is_refused_at_load_save_and_batch_1(tmp_path):
    from hf_vocabspec.configuration import check_batched_speculation
    from tiny import make_pair

    assert check_batched_speculation("on") == "on"
    with pytest.raises(ValueError, match=r"batched_speculation must be one of \('auto', 'on', 'off'\) \(got 'maybe'\)"):
        check_batched_speculation("maybe")
    target, base = make_pair()
    drafter = trim_drafter(base, torch.arange(3, 40))
    drafter.save_pretrained(tmp_path / "d")
    gen = tmp_path / "d" / "generation_config.json"
    gen.write_text(json.dumps(json.loads(gen.read_text()) | {"batched_speculation": "maybe"}))
    with pytest.raises(ValueError, match="got 'maybe'.*edit generation_config.json") as err:
        TrimmedDrafter.from_pretrained(tmp_path / "d")
    assert "\n" not in str(err.value)
    drafter.generation_config.batched_speculation = "maybe"
    with pytest.raises(ValueError, match="got 'maybe'"):
        drafter.save_pretrained(tmp_path / "e")
    assert not (tmp_path / "e").exists()
    with pytest.raises(ValueError, match="got 'maybe'"):  # batch 1: never read there, refused all the same
        target.generate(torch.tensor([[1, 5, 6]]), assistant_model=drafter, max_new_tokens=3, do_sample=False)


@pytest.mark.parametrize(("command", "argv", "needle"), [
    ("tune", ["--mode", "t1", "--confidence-thresholds", "0.3", "0.5"], "--confidence-thresholds and --mode t1 contradict"),
    ("tune", ["--acceptance", "ideal", "--confidence-thresholds", "0.3"],
     "--confidence-thresholds and --acceptance ideal contradict"),
    ("bench", ["--batched-speculation", "off"], "--batched-speculation only applies with --batch-sizes"),
    ("bench", ["--batch-sizes", "2", "--ks", "5000"], "--batch-sizes and --ks contradict"),
    ("bench", ["--batch-sizes", "2", "--coverages", "0.9", "0.95"], "--batch-sizes and 2 --coverages contradict"),
    ("bench", ["--batch-sizes", "2", "--modes", "t1"], "--batch-sizes and --modes contradict"),
])
def test_options_a_command_cannot_honour_are_refused_naming_the_conflict(capsys, no_loading, tmp_path, command, argv,
                                                                         needle):
    rc, err = run_cli(capsys, command, *argv, "--output", str(tmp_path / "out"))
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_tune_thresholds_default_with_sampling_is_not_refused(capsys, monkeypatch, tmp_path):
    """Only TYPED thresholds conflict: the default list with --mode t1 runs (reduced to 0 by the model, as documented)."""
    import hf_vocabspec.cli.tune as tune_cli

    monkeypatch.setattr(tune_cli, "_run", lambda args, out, tqdm: pytest.fail("reached the run") or {})
    monkeypatch.setattr("hf_vocabspec.cli.evaluation.check_drafter_tokenizer", lambda args: None)
    with pytest.raises(pytest.fail.Exception, match="reached the run"):
        main(["tune", "--target", SMOL, "--mode", "t1", "--output", str(tmp_path / "out")])


def test_bench_honours_ks_and_coverages_together(capsys, monkeypatch, tmp_path):
    from hf_vocabspec.evaluation import benchmark

    seen = {}
    monkeypatch.setattr(benchmark, "run_benchmark", lambda cfg, out, progress=None: seen.setdefault("cfg", cfg) and {})
    monkeypatch.setattr(benchmark, "format_report", lambda report: "")
    rc, err = run_cli(capsys, "bench", "--target", SMOL, "--ks", "5000", "--coverages", "0.9",
                      "--output", str(tmp_path / "out"))
    assert rc == 0, err
    assert seen["cfg"].ks == (5000,) and seen["cfg"].coverages == (0.9,)  # both trimmed (benchmark: sizes = both)


def _gpt2_drafter(n_positions: int = 16):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=n_positions,
                                      bos_token_id=1, eos_token_id=2)).eval()
    return trim_drafter(base, torch.arange(3, 30))


def test_position_limit_read_under_each_architecture_s_name():
    from transformers import PretrainedConfig

    from hf_vocabspec.modeling import position_limit

    assert position_limit(_gpt2_drafter(16)) == 16  # a trimmed drafter's body: GPT-2's n_positions
    assert position_limit(LlamaForCausalLM(llama_config())) == 256
    for name in ("n_ctx", "max_sequence_length", "seq_length"):
        assert position_limit(type("M", (), {"config": PretrainedConfig(**{name: 12})})()) == 12
    assert position_limit(type("M", (), {"config": PretrainedConfig()})()) is None  # no limit declared: no check


def test_prompt_plus_new_tokens_beyond_the_drafter_s_positions_is_refused():
    from tiny import make_pair

    from hf_vocabspec.generation.hooks import check_inputs

    target, _ = make_pair()
    drafter = _gpt2_drafter(16)
    long_prompt = torch.randint(3, 60, (1, 20))
    with pytest.raises(ValueError, match="prompt has 20 tokens but the drafter handles at most 16 positions"):
        target.generate(long_prompt, assistant_model=drafter, max_new_tokens=4, do_sample=False)
    ids = torch.randint(3, 60, (1, 10))
    check_inputs(target, drafter, ids, None, max_length=16)
    with pytest.raises(ValueError, match="reaches 20 positions but the drafter handles at most 16: shorten the prompt "
                                         "or lower max_new_tokens to at most 6") as err:
        check_inputs(target, drafter, ids, None, max_length=20)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("mask", "needle"), [
    (torch.ones(3, 4, dtype=torch.long), "attention_mask has 3 rows but input_ids has 2 prompts"),
    (torch.ones(4, dtype=torch.long), "attention_mask is 1-D (4,) but input_ids is (2, 4)"),
    (torch.ones(2, 5, dtype=torch.long), "attention_mask has shape (2, 5) but input_ids has (2, 4)"),
    (torch.full((2, 4), 2), "values other than 0 and 1"),
    (torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]]), "row 1 is all zeros"),
    ([[1, 1, 1, 1], [1, 1, 1, 1]], "is a list, not a tensor"),
])
def test_attention_mask_is_checked_as_given(mask, needle):
    from hf_vocabspec.generation.hooks import check_attention_mask

    ids = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]])
    check_attention_mask(ids, None)
    check_attention_mask(ids, torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match=re_escape(needle)) as err:
        check_attention_mask(ids, mask)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="1-D"):  # batch 1 too: transformers raises IndexError on it
        check_attention_mask(ids[:1], torch.ones(4, dtype=torch.long))


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


def test_generate_checks_the_attention_mask_as_given():
    from tiny import make_pair

    target, base = make_pair()
    drafter = trim_drafter(base, torch.arange(3, 40))
    ids = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]])
    for mask in (torch.ones(3, 4, dtype=torch.long), torch.ones(4, dtype=torch.long)):
        try:
            target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=3, do_sample=False)
        except ValueError as err:
            assert "attention_mask" in str(err)
        else:
            raise AssertionError("accepted a mask that does not fit input_ids")


def test_assistant_model_with_prompt_lookup_is_refused():
    from transformers import GenerationConfig

    from hf_vocabspec.generation.hooks import check_generate_kwargs

    check_generate_kwargs(GenerationConfig(prompt_lookup_num_tokens=3))
    check_generate_kwargs(GenerationConfig(), assistant_model=object())
    with pytest.raises(ValueError, match="assistant_model= and prompt_lookup_num_tokens= each choose how drafts are "
                                         "made .*pass one of them"):
        check_generate_kwargs(GenerationConfig(prompt_lookup_num_tokens=3), assistant_model=object())


def test_generate_refuses_assistant_model_with_prompt_lookup():
    from tiny import make_pair

    target, base = make_pair()
    drafter = trim_drafter(base, torch.arange(3, 40))
    try:
        target.generate(torch.tensor([[1, 5, 6, 7]]), assistant_model=drafter, prompt_lookup_num_tokens=3,
                        max_new_tokens=3, do_sample=False)
    except ValueError as err:
        assert "prompt_lookup_num_tokens" in str(err)
    else:
        raise AssertionError("drafted with the assistant and dropped prompt lookup without a word")


def test_select_refuses_counts_of_special_tokens_only(capsys, no_loading, tmp_path, tok):
    special = torch.tensor(sorted(set(tok.all_special_ids)))
    counts = torch.zeros(len(tok), dtype=torch.int64)
    counts[special] = 7
    TokenCounts(counts, 5, 5, tok.name_or_path, tokenizer_sha256(tok)).save(tmp_path / "special.safetensors")
    for command in ("select", "trim"):
        rc, err = run_cli(capsys, command, "--counts", str(tmp_path / "special.safetensors"),
                          "--output", str(tmp_path / "out"))
        assert rc == 2 and "hold only special tokens" in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "out").exists()


def test_empty_assistant_turns_are_named_as_empty(tok):
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": content}]}
            for content in (None, "", "  \n")]
    with pytest.raises(ValueError, match="all 3 assistant turn\\(s\\) have empty content") as err:
        hf_vocabspec.count_assistant_tokens(rows, tok, progress=False)
    assert "roles" not in str(err.value)


@pytest.fixture
def unwritable(tmp_path):
    """A folder this process cannot create files in: a read-only one, or /sys where that is unwritable (root)."""
    import tempfile

    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        fd, probe = tempfile.mkstemp(dir=folder)
    except OSError:
        yield folder
        folder.chmod(0o755)
        return
    os.close(fd)
    os.unlink(probe)
    folder.chmod(0o755)
    try:
        fd, probe = tempfile.mkstemp(dir="/sys")
    except OSError:
        yield Path("/sys")
        return
    os.close(fd)
    os.unlink(probe)
    pytest.skip("no folder this process cannot write")


def test_unwritable_outputs_are_refused_before_any_work(capsys, no_loading, tmp_path, unwritable, saved):
    capsys.readouterr()  # the fixture's save progress bar
    for argv in (["count", "--output", str(unwritable / "counts.safetensors")],
                 ["trim", "--k", "100", "--output", str(unwritable / "drafter")],
                 ["bench", "--output", str(unwritable / "bench")]):
        rc, err = run_cli(capsys, *argv)
        assert rc == 2 and "cannot write in" in err and "choose a folder you can write" in err, err
        assert len(err.strip().splitlines()) == 1 and ".tmp-" not in err, err
    drafter, _ = saved
    with pytest.raises(OSError, match="is not writable .*choose a folder you can write") as err:
        drafter.save_pretrained(unwritable / "drafter")
    assert ".tmp-" not in str(err.value)


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


def test_messages_name_a_fix_that_exists(tmp_path, counts_file, capsys):
    with pytest.raises(ValueError, match="counts go to `hf-vocabspec select --counts` or `trim --counts`"):
        load_model(str(counts_file))
    rc, err = run_cli(capsys, "bench", "--target", str(counts_file), "--output", str(tmp_path / "out"))
    assert rc == 2 and "pass it as --counts" not in err and "select --counts" in err, err
    LlamaForCausalLM(llama_config()).save_pretrained(tmp_path / "plain")
    with pytest.raises(OSError, match="it is a plain model; trim it first .*hf-vocabspec trim --drafter") as err:
        TrimmedDrafter.from_pretrained(tmp_path / "plain")
    assert "copy or download" not in str(err.value)


def test_generate_refuses_prompt_plus_new_tokens_beyond_the_drafter_s_positions():
    from tiny import make_pair

    target, _ = make_pair()
    try:  # 10 + 10 > 16: the drafter's position embedding is indexed past its end (IndexError) unless refused
        target.generate(torch.randint(3, 60, (1, 10)), assistant_model=_gpt2_drafter(16), max_new_tokens=10,
                        do_sample=False)
    except ValueError as err:
        assert "lower max_new_tokens" in str(err)
    else:
        raise AssertionError("generated past the drafter's positions")


def test_trim_keeping_the_whole_vocabulary_runs_and_reports_1x(capsys, cli_model, tmp_path):
    """#38: `trim --k <vocabulary size>` (or a search that picks the whole head, as a noisy measured curve can on a
    small model) saved the drafter, then crashed with 'list index out of range': the latency measurement of the
    trimmed and the full head had one size for both."""
    model, chats = cli_model
    rc, err = run_cli(capsys, "trim", "--drafter", str(model), "--dataset", str(chats), "--k", "64", "--dtype",
                      "float32", "--output", str(tmp_path / "whole"))
    assert rc == 0, err
    assert (tmp_path / "whole" / "config.json").is_file()
