"""The lm-eval backend ``hf-vocabspec``: per-sample outputs equal lm-eval's ``hf`` backend (CLI, Python route,
two processes), loglikelihood scores equal, a mismatched drafter refused in one line before any task loads, and a
sampled task with repeats seeded reproducibly.

Fast tests use a tiny random target with SmolLM2's tokenizer (its outputs are gibberish, but the same gibberish
for both backends); the integration tests run SmolLM2-135M with a trimmed bf16 copy as drafter through the CLI.
"""

from __future__ import annotations

import copy
import glob
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval", reason="the lmeval extra is not installed: pip install -e '.[lmeval]'")

from hf_vocabspec import trim_drafter  # noqa: E402
from hf_vocabspec.evaluation.lmeval import TASKS_DIR, VocabSpecLM, _option, precheck, run_cli  # noqa: E402
from hf_vocabspec.evaluation.offline import load_model, load_tokenizer, resolve_model_path  # noqa: E402

SMOL = "offline:smollm2-135m-instruct"
BIN = Path(sys.executable).parent
GEN = "max_gen_toks=24"  # short rows; the tasks' stop sequences end some rows earlier


# --- helpers ------------------------------------------------------------------------------------------------
def _trimmed(model, tokenizer, path: Path, keep: int = 16384) -> Path:
    drafter = trim_drafter(model, torch.arange(keep), tokenizer=tokenizer, target_model=SMOL)
    drafter.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _env() -> dict:
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
            "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(out: Path, model: str, model_args: str, tasks: str, *, batch_size: int = 1, launch: list[str] | None = None,
         check: bool = True) -> subprocess.CompletedProcess:
    """``python -m hf_vocabspec.lmeval run ...`` (or under ``launch``) with --log_samples into ``out``."""
    cmd = [*(launch or [sys.executable]), "-m", "hf_vocabspec.lmeval", "run", "--model", model, "--model_args",
           model_args, "--device", "cpu", "--include_path", str(TASKS_DIR), "--tasks", tasks, "--limit", "4",
           "--gen_kwargs", GEN, "--batch_size", str(batch_size), "--log_samples", "--output_path", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=900)
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _samples(out: Path, task: str) -> dict[int, list]:
    files = glob.glob(str(out / "*" / f"samples_{task}_2*.jsonl"))  # _2<date>: not <task>_loglik
    assert len(files) == 1, files
    rows = [json.loads(line) for line in Path(files[0]).read_text().splitlines() if line.strip()]
    return {r["doc_id"]: r["resps"] for r in rows}


def _results(out: Path) -> dict:
    files = glob.glob(str(out / "*" / "results_*.json"))
    assert len(files) == 1, files
    return json.loads(Path(files[0]).read_text())


# --- fast: parsing, refusal, the Python route on a tiny model ----------------------------------------------
def test_tasks_dir_ships_the_offline_tasks(capsys):
    assert run_cli(["tasks-dir"]) == 0
    assert capsys.readouterr().out.strip() == str(TASKS_DIR)
    names = {p.stem for p in TASKS_DIR.glob("*.yaml")}
    assert {"vocabspec_humaneval", "vocabspec_humaneval_sampled", "vocabspec_sharegpt",
            "vocabspec_humaneval_loglik"} <= names


def test_options_are_read_as_lm_eval_reads_them():
    argv = ["run", "-M", "hf", "--model", "hf-vocabspec", "--model_args=pretrained=x", "-o", "out"]
    assert _option(argv, "--model", "-M") == "hf-vocabspec"
    assert _option(argv, "--model_args", "-a") == "pretrained=x"
    assert _option(argv, "--output_path", "-o") == "out"
    precheck(["run", "--model", "hf", "--model_args", "pretrained=anything"])  # other backends: lm-eval's business
    with pytest.raises(ValueError, match="pretrained="):
        precheck(["run", "--model", "hf-vocabspec", "--model_args", "drafter=x"])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama target with SmolLM2's tokenizer, a trimmed perturbed copy, and a drafter trimmed for
    another tokenizer (one extra token)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer(SMOL)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    target = LlamaForCausalLM(cfg).eval()
    base = copy.deepcopy(target)
    with torch.no_grad():
        for p in base.parameters():
            p.add_(0.02 * torch.randn_like(p))
    root = tmp_path_factory.mktemp("tiny")
    drafter = _trimmed(base, tokenizer, root / "drafter", keep=8192)
    other = copy.deepcopy(tokenizer)
    other.add_tokens(["<not-in-smollm2>"])
    wrong = trim_drafter(LlamaForCausalLM(LlamaConfig(**{**cfg.to_dict(), "vocab_size": len(other)})),
                         torch.arange(4096), tokenizer=other)
    wrong.save_pretrained(root / "wrong")
    return tokenizer, target, drafter, root / "wrong"


@pytest.fixture(scope="module")
def task_manager():
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASKS_DIR))  # indexing lm-eval's own tasks takes seconds: once


def _evaluate(lm, task_manager, task: str, limit: int = 3, max_gen_toks: int = 12, **kw) -> dict:
    import lm_eval

    return lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=task_manager, limit=limit, log_samples=True,
                                   gen_kwargs=f"max_gen_toks={max_gen_toks}", bootstrap_iters=0, **kw)


def _resps(results: dict, task: str) -> dict[int, list]:
    return {s["doc_id"]: s["resps"] for s in results["samples"][task]}


def test_python_route_equals_hf_backend(tiny, task_manager):
    """lm_eval.simple_evaluate(model=<our backend>) gives the hf backend's outputs and reports speculation."""
    from lm_eval.models.huggingface import HFLM

    tokenizer, target, drafter, _ = tiny
    ref = _evaluate(HFLM(pretrained=target, tokenizer=tokenizer, batch_size=1), task_manager, "vocabspec_humaneval")
    lm = VocabSpecLM(pretrained=target, tokenizer=tokenizer, drafter=str(drafter), batch_size=1)
    ours = _evaluate(lm, task_manager, "vocabspec_humaneval")
    assert _resps(ours, "vocabspec_humaneval") == _resps(ref, "vocabspec_humaneval")
    report = ours["config"]["speculation"]
    assert report["generate_calls"] == 3 and report["proposed"] > 0 and report["tau"] >= 1
    assert ours["config"]["drafter"] == str(drafter)


def test_compile_draft_step_model_arg_equals_hf_backend(tiny, task_manager):
    """``compile_draft_step=True`` (a model arg, as ``--model_args ...,compile_draft_step=True`` passes it): the
    drafter's steps run compiled (a real Inductor compile) and the outputs are the hf backend's."""
    from lm_eval.models.huggingface import HFLM
    from lm_eval.utils import simple_parse_args_string

    tokenizer, target, drafter, _ = tiny
    ref = _evaluate(HFLM(pretrained=target, tokenizer=tokenizer, batch_size=1), task_manager, "vocabspec_humaneval",
                    limit=2)
    args = simple_parse_args_string(f"drafter={drafter},compile_draft_step=True")
    lm = VocabSpecLM(pretrained=target, tokenizer=tokenizer, batch_size=1, **args)
    ours = _evaluate(lm, task_manager, "vocabspec_humaneval", limit=2)
    assert _resps(ours, "vocabspec_humaneval") == _resps(ref, "vocabspec_humaneval")
    assert lm.drafter.compile_draft_step and lm.drafter.last_speculation_stats.compiled_draft
    with pytest.raises(ValueError, match="compile_draft_step=True"):
        VocabSpecLM(pretrained=target, tokenizer=tokenizer, drafter=str(drafter), compile_draft_step="yes")


def test_loglikelihood_equals_hf_backend(tiny, task_manager):
    from lm_eval.models.huggingface import HFLM

    tokenizer, target, drafter, _ = tiny
    hf = HFLM(pretrained=target, tokenizer=tokenizer, batch_size=2)
    ref = _evaluate(hf, task_manager, "vocabspec_humaneval_loglik")
    lm = VocabSpecLM(pretrained=target, tokenizer=tokenizer, drafter=str(drafter), batch_size=2)
    ours = _evaluate(lm, task_manager, "vocabspec_humaneval_loglik")
    assert ours["results"] == ref["results"]
    assert _resps(ours, "vocabspec_humaneval_loglik") == _resps(ref, "vocabspec_humaneval_loglik")
    assert ours["config"]["speculation"]["generate_calls"] == 0


def test_sampled_task_with_repeats_is_seeded(tiny, task_manager):
    """do_sample with repeats=4 runs through the drafter; the same seeds give the same samples."""
    tokenizer, target, drafter, _ = tiny
    runs = []
    for _ in range(2):
        lm = VocabSpecLM(pretrained=target, tokenizer=tokenizer, drafter=str(drafter), batch_size=1)
        runs.append(_evaluate(lm, task_manager, "vocabspec_humaneval_sampled", limit=1, max_gen_toks=8))
    first, second = (_resps(r, "vocabspec_humaneval_sampled") for r in runs)
    assert first == second
    (samples,) = first[0]  # one request per doc, its `repeats` answers
    assert len(samples) == 4 and len(set(samples)) > 1  # sampled, not one answer repeated
    assert runs[0]["config"]["speculation"]["generate_calls"] == 4


def test_wrong_tokenizer_drafter_refused_before_the_target_loads(tiny, monkeypatch):
    from lm_eval.models.huggingface import HFLM

    from hf_vocabspec.hub import DrafterMismatchError

    _, _, _, wrong = tiny
    monkeypatch.setattr(HFLM, "__init__", lambda *a, **k: pytest.fail("the target was loaded"))
    with pytest.raises(DrafterMismatchError, match="tokenizer"):
        VocabSpecLM(pretrained=SMOL, drafter=str(wrong))


def test_cli_refuses_wrong_tokenizer_in_one_line_before_tasks(tiny, tmp_path):
    _, _, _, wrong = tiny
    proc = _cli(tmp_path / "out", "hf-vocabspec", f"pretrained={SMOL},drafter={wrong}", "vocabspec_humaneval",
                check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]  # models named on the command line that do not fit: exit 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("hf-vocabspec lm-eval: error: ") and "tokenizer" in lines[-1], lines[-1]
    assert "Traceback" not in proc.stderr
    assert "Selected Tasks" not in proc.stderr and "Building contexts" not in proc.stderr
    assert not (tmp_path / "out").exists()


# --- integration: SmolLM2-135M through lm-eval's CLI ---------------------------------------------------------
TASKS = "vocabspec_humaneval,vocabspec_sharegpt"


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """The converted SmolLM2 folder, a trimmed bf16 copy as drafter, and the hf backend's batch-1 run."""
    root = tmp_path_factory.mktemp("smol")
    tokenizer = load_tokenizer(SMOL)
    drafter = _trimmed(load_model(SMOL, dtype=torch.bfloat16), tokenizer, root / "drafter")
    target = resolve_model_path(SMOL)
    _cli(root / "hf1", "hf", f"pretrained={target},dtype=float32", TASKS + ",vocabspec_humaneval_loglik")
    return target, drafter, root


@pytest.mark.integration
def test_cli_outputs_equal_hf_backend_at_batch_1(smol, tmp_path):
    target, drafter, root = smol
    tokenizer = load_tokenizer(SMOL)
    proc = _cli(tmp_path, "hf-vocabspec", f"pretrained={SMOL},drafter={drafter},dtype=float32",
                TASKS + ",vocabspec_humaneval_loglik")
    for task in TASKS.split(","):
        ours, ref = _samples(tmp_path, task), _samples(root / "hf1", task)
        assert ours == ref, task
        assert len(ours) == 4
    texts = [r[0][0] for task in TASKS.split(",") for r in _samples(tmp_path, task).values()]
    lengths = [len(tokenizer(t, add_special_tokens=False).input_ids) for t in texts]
    assert len(set(lengths)) > 1 and min(lengths) < 20, lengths  # stop sequences / EOS ended rows early, unevenly
    assert _results(tmp_path)["results"]["vocabspec_humaneval_loglik"] == \
        _results(root / "hf1")["results"]["vocabspec_humaneval_loglik"]
    assert "hf-vocabspec speculation" in proc.stdout
    (spec_file,) = glob.glob(str(tmp_path / "*" / "speculation_*.json"))
    report = json.loads(Path(spec_file).read_text())
    assert report["generate_calls"] == 8 and report["accepted"] > 0 and report["processes"] == 1
    assert _results(tmp_path)["config"]["speculation"] == report


@pytest.mark.integration
def test_cli_outputs_equal_hf_backend_at_batch_4(smol, tmp_path):
    target, drafter, _ = smol
    _cli(tmp_path / "ours", "hf-vocabspec", f"pretrained={SMOL},drafter={drafter},dtype=float32", TASKS,
         batch_size=4)
    _cli(tmp_path / "hf", "hf", f"pretrained={target},dtype=float32", TASKS, batch_size=4)
    for task in TASKS.split(","):
        assert _samples(tmp_path / "ours", task) == _samples(tmp_path / "hf", task), task


@pytest.mark.integration
def test_two_processes_give_the_one_process_outputs(smol, tmp_path):
    """accelerate launch with 2 CPU processes splits the requests and gives the hf backend's per-sample outputs."""
    _, drafter, root = smol
    launch = [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port",
              str(_free_port())]
    proc = _cli(tmp_path, "hf-vocabspec", f"pretrained={SMOL},drafter={drafter},dtype=float32", TASKS, launch=launch)
    for task in TASKS.split(","):
        assert _samples(tmp_path, task) == _samples(root / "hf1", task), task
    report = _results(tmp_path)["config"]["speculation"]
    assert report["processes"] == 2 and report["generate_calls"] == 8, report
    assert "2 process(es)" in proc.stdout
