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


def test_counts_file_and_model_file_swapped(tmp_path, counts_file):
    with pytest.raises(ValueError, match="counts file \\(pass it as --counts\\), not a model"):
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
    rc, err = run_cli(capsys, "select", "--counts", str(counts_file), "--min-coverage", "0.99", "--max-k", "2",
                      "--output", str(tmp_path / "sel"))
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
    other_target = LlamaForCausalLM(llama_config(vocab_size=len(tok) + 64)).eval()
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
