"""Distillation on tiny random models: it learns, resumes to the same weights, and bad input names the fix."""

from __future__ import annotations

import json
import random

import pytest
import torch
from tiny import VOCAB, llama_config
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from hf_vocabspec import TrimmedDrafter, trim_drafter
from hf_vocabspec.evaluation.distill import (
    CONFIG_FILE,
    OPTIMIZER_FILE,
    REPORT_FILE,
    SCHEDULER_FILE,
    DistillConfig,
    DistillResult,
    build_student,
    checkpoint_dir,
    distill,
)

# w3 / w4 play the role markers; the word-level tokenizer keeps the test free of real-model downloads
TEMPLATE = ("{% for m in messages %}{{ 'w3' if m['role'] != 'assistant' else 'w4' }} {{ m['content'] }} </s> "
            "{% endfor %}{% if add_generation_prompt %}w4 {% endif %}")


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(3, VOCAB)]
    tok = Tokenizer(models.WordLevel({n: i for i, n in enumerate(names)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = TEMPLATE
    return fast


def chats(n: int = 120, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)

    def words(lo, hi):
        return " ".join(f"w{rng.randrange(5, VOCAB)}" for _ in range(rng.randrange(lo, hi)))

    return [{"messages": [m for _ in range(rng.randrange(1, 3))
                          for m in ({"role": "user", "content": words(3, 8)},
                                    {"role": "assistant", "content": words(8, 24)})]} for _ in range(n)]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def target():
    """A 2-layer tiny llama whose layers matter: random residual branches are scaled up so the first layer
    alone agrees with it only ~20% of the time (plain random layers barely move the embedding's argmax)."""
    torch.manual_seed(3)
    model = LlamaForCausalLM(llama_config(num_hidden_layers=2)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.mul_(4.0)
        model.lm_head.weight.mul_(8.0)
    return model


def config(target, out, **kw) -> DistillConfig:
    base = {"target": target, "tokenizer": tiny_tokenizer(), "dataset": chats(), "num_layers": 1,
            "output_dir": out, "seq_len": 32, "batch_size": 4, "lr": 3e-3, "warmup_steps": 2, "max_steps": 30,
            "save_every": 10, "eval_sequences": 16, "target_dtype": "float32", "autocast": False}
    base.update(kw)
    return DistillConfig(**base)


def test_learns_and_saves_a_trimmable_checkpoint(target, tmp_path):
    out = tmp_path / "student"
    res = distill(config(target, out), progress=False)
    assert isinstance(res, DistillResult) and res.world_size == 1
    assert res.step == 30 and res.steps_done == 30 and res.stopped == "max_steps"
    report = json.loads((out / REPORT_FILE).read_text())
    losses = [loss for _, loss in report["loss_history"]]
    assert len(losses) == 30 and sum(losses[-5:]) < 0.7 * sum(losses[:5]), losses
    assert res.final_agreement > res.initial_agreement + 0.08, res
    assert report["final_agreement"] == res.final_agreement and report["step"] == 30
    assert [s for s, _ in report["agreement_history"]] == [0, 10, 20, 30]
    assert res.tokens_seen == 30 * 4 * 32 and 0 < res.assistant_positions_seen < res.tokens_seen
    # a plain HF directory: safetensors only, loads with Auto*, trims with the tokenizer saved beside it
    assert not list(out.glob("*.bin")) and not list(out.glob("*.pt")) and not list(out.glob("*.pth"))
    # resumable checkpoints beside it, without pickle: optimizer moments in safetensors, the rest JSON
    ckpts = checkpoint_dir(out)
    last = ckpts / "checkpoint-30"
    assert sorted(p.name for p in ckpts.iterdir()) == ["checkpoint-20", "checkpoint-30"]
    assert (last / OPTIMIZER_FILE).is_file() and (last / SCHEDULER_FILE).is_file() and (last / CONFIG_FILE).is_file()
    assert not [f.name for f in ckpts.rglob("*") if f.suffix in (".pt", ".pth", ".bin", ".pkl")]
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.num_hidden_layers == 1
    from transformers import AutoTokenizer

    drafter = trim_drafter(model, range(3, 40), tokenizer=AutoTokenizer.from_pretrained(out))
    assert isinstance(drafter, TrimmedDrafter)
    assert not list(tmp_path.glob(".student.*"))  # no temp/old dirs left behind


def test_resume_matches_an_uninterrupted_run(target, tmp_path):
    """Trainer's resume (weights, AdamW moments from safetensors, schedule and RNG from JSON, the data
    stream replayed past the trained batches) continues exactly where an uninterrupted run would be."""
    kw = {"max_steps": 6, "save_every": 3, "autocast": True, "target_dtype": "bfloat16"}
    straight = distill(config(target, tmp_path / "a", **kw), progress=False)
    first = distill(config(target, tmp_path / "b", **dict(kw, max_steps=3)), progress=False)
    assert first.step == 3
    assert (checkpoint_dir(tmp_path / "b") / "checkpoint-3" / "trainer_state.json").is_file()
    resumed = distill(config(target, tmp_path / "b", **kw), progress=False)
    assert resumed.step == 6 and resumed.steps_done == 3
    assert resumed.initial_agreement == straight.initial_agreement
    assert resumed.tokens_seen == straight.tokens_seen == 6 * 4 * 32
    assert resumed.assistant_positions_seen == straight.assistant_positions_seen
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "a").state_dict()
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "b").state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
    la = json.loads((tmp_path / "a" / REPORT_FILE).read_text())["loss_history"]
    lb = json.loads((tmp_path / "b" / REPORT_FILE).read_text())["loss_history"]
    assert [s for s, _ in la] == [s for s, _ in lb] == list(range(1, 7))
    assert [v for _, v in la] == pytest.approx([v for _, v in lb], rel=1e-4)
    # rerunning a finished run trains no further (Trainer alone would take one more step)
    again = distill(config(target, tmp_path / "b", **kw), progress=False)
    assert again.step == 6 and again.steps_done == 0 and again.final_agreement == resumed.final_agreement
    # a resume with settings that change the data order is refused, naming the way out
    with pytest.raises(ValueError, match="--overwrite"):
        distill(config(target, tmp_path / "b", **dict(kw, batch_size=2)), progress=False)


def test_resume_power_check(target, tmp_path, monkeypatch):
    """The comparison above can fail: a resume that does not skip the batches already trained on (it
    trains on the first windows again) ends at other weights."""
    import hf_vocabspec.evaluation.distill as mod

    kw = {"max_steps": 4, "save_every": 2, "target_dtype": "float32", "autocast": False}
    distill(config(target, tmp_path / "a", **kw), progress=False)
    distill(config(target, tmp_path / "b", **dict(kw, max_steps=2)), progress=False)
    args = mod._training_args(config(target, tmp_path / "b", **kw), checkpoint_dir(tmp_path / "b"), False)
    args.ignore_data_skip = True
    monkeypatch.setattr(mod, "_training_args", lambda *a, **k: args)
    assert distill(config(target, tmp_path / "b", **kw), progress=False).steps_done == 2
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "a").state_dict()
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "b").state_dict()
    assert any(not torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-6) for k in a)


def test_time_budget_stops_and_saves(target, tmp_path):
    res = distill(config(target, tmp_path / "t", max_steps=None, time_budget_s=0.01), progress=False)
    assert res.stopped == "time_budget" and res.step == 0
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "t").config.num_hidden_layers == 1
    # with a checkpoint to resume from and no time to train: the student is the checkpoint's
    two = distill(config(target, tmp_path / "u", max_steps=2, save_every=2), progress=False)
    again = distill(config(target, tmp_path / "u", max_steps=None, time_budget_s=0.01), progress=False)
    assert again.stopped == "time_budget" and again.step == 2 and again.steps_done == 0
    assert again.final_agreement == pytest.approx(two.final_agreement)
    trained = AutoModelForCausalLM.from_pretrained(checkpoint_dir(tmp_path / "u") / "checkpoint-2").state_dict()
    for k, v in AutoModelForCausalLM.from_pretrained(tmp_path / "u").state_dict().items():
        torch.testing.assert_close(v, trained[k], msg=k)


@pytest.mark.parametrize("how", ["sigterm", "budget"])
def test_stops_mid_run_evaluates_and_saves(target, tmp_path, monkeypatch, how):
    """A SIGTERM (or the wall-clock budget running out) during step 3 ends training after that step with
    an evaluation and a resumable checkpoint; the process's signal handler is restored afterwards."""
    import os
    import signal

    import hf_vocabspec.evaluation.distill as mod

    begin = mod._Budget.on_step_begin

    def on_step_begin(self, args, state, control, **kw):
        if state.global_step == 2:
            if how == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
            else:
                self.budget_s = 0.0
        return begin(self, args, state, control, **kw)

    monkeypatch.setattr(mod._Budget, "on_step_begin", on_step_begin)
    handler = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "s"
    res = distill(config(target, out, max_steps=50, time_budget_s=3600.0), progress=False)
    assert signal.getsignal(signal.SIGTERM) is handler
    assert res.stopped == ("interrupted" if how == "sigterm" else "time_budget") and res.step == 3
    report = json.loads((out / REPORT_FILE).read_text())
    assert report["agreement_history"][-1][0] == 3 and report["step"] == 3
    assert (checkpoint_dir(out) / "checkpoint-3" / "trainer_state.json").is_file()


def test_leaves_global_state_alone(target, tmp_path):
    import random

    import numpy as np

    torch.manual_seed(123)
    random.seed(5)
    np.random.seed(7)
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    distill(config(target, tmp_path / "g", max_steps=2, save_every=2), progress=False)
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
    assert (np.random.get_state()[1] == states[2]).all()


def test_student_starts_as_the_target_prefix(target):
    student = build_student(target, 1)
    assert student.config.num_hidden_layers == 1 and target.config.num_hidden_layers == 2
    for k, v in student.state_dict().items():
        torch.testing.assert_close(v, target.state_dict()[k])


@pytest.mark.parametrize("layers, match", [(2, "between 1 and 1"), (5, ">= the target's 2 layers"),
                                           (0, "at least 1 layer")])
def test_bad_num_layers_names_the_fix(target, tmp_path, layers, match):
    with pytest.raises(ValueError, match=match) as err:
        distill(config(target, tmp_path / "x", num_layers=layers), progress=False)
    assert "--num-layers" in str(err.value)


def test_dataset_without_assistant_turns_names_the_fix(target, tmp_path):
    users_only = [{"messages": [{"role": "user", "content": "w5 w6 w7"}]} for _ in range(10)]
    with pytest.raises(ValueError, match="no assistant turns.*pass a chat dataset with responses"):
        distill(config(target, tmp_path / "x", dataset=users_only), progress=False)
    with pytest.raises(ValueError, match="tokenizer="):
        distill(config(target, tmp_path / "x", tokenizer=None), progress=False)
    with pytest.raises(ValueError, match="--max-steps and/or --time-budget"):
        distill(config(target, tmp_path / "x", max_steps=None), progress=False)


def test_refuses_a_foreign_output_dir(target, tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="--output"):
        distill(config(target, tmp_path / "other"), progress=False)
    old = tmp_path / "old-format"  # the hand-written loop kept its state inside the student directory
    old.mkdir()
    (old / "trainer_state.json").write_text("{}")
    (old / REPORT_FILE).write_text("{}")
    with pytest.raises(FileExistsError, match="--overwrite"):
        distill(config(target, old), progress=False)
    assert distill(config(target, old, max_steps=1, save_every=1, overwrite=True), progress=False).step == 1
    assert not (old / "trainer_state.json").exists()


def test_cli_distill_from_saved_target_and_jsonl(target, tmp_path, capsys):
    from hf_vocabspec.cli import main

    target.save_pretrained(tmp_path / "target")
    tiny_tokenizer().save_pretrained(tmp_path / "target")
    data = tmp_path / "chats.jsonl"
    data.write_text("\n".join(json.dumps(c) for c in chats(60)))
    out = tmp_path / "cli-student"
    assert main(["distill", "--target", str(tmp_path / "target"), "--dataset", str(data), "--num-layers", "1",
                 "--max-steps", "4", "--save-every", "2", "--seq-len", "32", "--batch-size", "2",
                 "--eval-sequences", "4", "--target-dtype", "float32", "--output", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["step"] == 4 and summary["stopped"] == "max_steps" and summary["world_size"] == 1
    assert json.loads((out / REPORT_FILE).read_text())["step"] == 4
    assert AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 1


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_under_accelerate_launch(target, tmp_path):
    """The same command under `accelerate launch` on 2 REAL CPU processes (gloo): both ranks train
    (tokens counted over both), the student loads, and the checkpoint resumes under 2 processes."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    target.save_pretrained(tmp_path / "target")
    tiny_tokenizer().save_pretrained(tmp_path / "target")
    data = tmp_path / "chats.jsonl"
    data.write_text("\n".join(json.dumps(c) for c in chats(60)))
    out = tmp_path / "student"
    # NOTE: `--cpu --num_processes 2` starts ONE process; --multi_gpu starts two via torchrun (see test_distributed)
    launch = [str(Path(sys.executable).parent / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
              "--main_process_port", str(_free_port()), "-m", "hf_vocabspec.cli", "distill",
              "--target", str(tmp_path / "target"), "--dataset", str(data), "--num-layers", "1", "--save-every", "2",
              "--seq-len", "32", "--batch-size", "2", "--eval-sequences", "4", "--target-dtype", "float32",
              "--no-progress", "--output", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}

    def run(steps):
        proc = subprocess.run(launch + ["--max-steps", str(steps)], check=False, capture_output=True, text=True, env=env,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.count('"world_size"') == 1, proc.stdout  # one rank prints the summary
        return json.loads(proc.stdout[proc.stdout.index("{"):])

    summary = run(3)
    assert summary["world_size"] == 2 and summary["global_batch"] == 4 and summary["step"] == 3
    assert summary["tokens_seen"] == 3 * 2 * 2 * 32  # gathered over both ranks: each fed its own batch
    report = json.loads((out / REPORT_FILE).read_text())
    assert report["world_size"] == 2 and report["config"]["world_size"] == 2
    assert AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 1
    ckpt = checkpoint_dir(out) / "checkpoint-3"
    assert {p.name for p in ckpt.glob("rng_state_*")} == {"rng_state_0.safetensors", "rng_state_1.safetensors"}
    resumed = run(4)
    assert resumed["step"] == 4 and resumed["steps_done"] == 1 and resumed["tokens_seen"] == 4 * 2 * 2 * 32


@pytest.mark.integration
def test_real_target_two_steps(tmp_path):
    """SmolLM2-135M-Instruct on ShareGPT through the real chat template: two steps train, agreement is
    scored on held-out assistant positions, and the student loads and trims. (float32: bf16 is emulated,
    and slow, on CPUs without AVX-512 BF16.)"""
    from transformers import AutoTokenizer

    out = tmp_path / "smol-2l"
    res = distill(DistillConfig(target="offline:smollm2-135m-instruct", dataset="offline:sharegpt", num_layers=2,
                                output_dir=out, seq_len=256, batch_size=1, max_steps=2, save_every=2,
                                eval_sequences=4, target_dtype="float32", autocast=False), progress=False)
    assert res.step == 2 and res.stopped == "max_steps" and res.loss_first > 0 and res.meta["eval_positions"] >= 32
    assert 0.0 <= res.initial_agreement <= 1.0 and 0.0 <= res.final_agreement <= 1.0
    assert 0 < res.assistant_positions_seen <= res.tokens_seen == 2 * 256
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.num_hidden_layers == 2
    assert isinstance(trim_drafter(model, range(3, 2000), tokenizer=AutoTokenizer.from_pretrained(out)), TrimmedDrafter)
