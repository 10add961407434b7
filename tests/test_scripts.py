"""Prepared scripts for machines CI never sees (a lent GPU): each smoke-runs here on CPU with shrunk shapes, so a
session that gets a GPU runs a script that already works (scripts/bench_gpu_generate.py via scripts/gpu_generate.sh)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from transformers import Qwen2Config

ROOT = Path(__file__).resolve().parents[1]


def test_bench_gpu_generate_smoke_on_cpu(tmp_path):
    configs = tmp_path / "configs"
    for name, layers in (("qwen2.5-coder-1.5b-instruct", 3), ("qwen2.5-coder-0.5b-instruct", 2)):
        Qwen2Config(vocab_size=151_936, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                    num_attention_heads=4, num_key_value_heads=2, eos_token_id=151_645, pad_token_id=151_643,
                    bos_token_id=151_643).save_pretrained(configs / name)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_gpu_generate.py"), "--device", "cpu", "--scale", "tiny",
         "--configs", str(configs), "--out", str(out), "--new-tokens", "6", "--none-new-tokens", "2",
         "--repeats", "1", "--prompt-tokens", "8", "--static-on-cpu", "--dtype", "float32",
         "--profile", "--plan", "pair-q:eager:1,2", "pair-q:compiled:1", "7b:eager:1", "pair-q:assisted:1"],
        capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    table = (out / "gpu_generate.md").read_text()
    # transformers < 5.24 refuses a static cache in its assisted loop: that row says so (5.24 runs it)
    table = table.replace("failed: ValueError: assisted generate is not supported with Static cache classes", "")
    assert "DIFFERS" not in table and "failed" not in table and "skipped" not in table, table
    assert "ours eager, static target cache" in table and "ours static cache, eager verify" in table, table
    profiles = (out / "profile.txt").read_text()  # --profile: one table per method at batch 1
    assert "=== pair-q 1 ours eager, all accepted" in profiles and "transformers assisted, dynamic" in profiles
    assert "ours static cache, eager verify" in profiles and "aten::" in profiles
    rows = json.loads((out / "gpu_generate.json").read_text())
    methods = {(r["shape"], r["batch"], r["method"].split(" (")[0]) for r in rows}
    for b in (1, 2):
        for m in ("target-only eager", "ours eager, all accepted", "ours eager, none accepted"):
            assert ("pair-q", b, m) in methods, sorted(methods)
    assert ("7b", 1, "ours eager, all accepted") in methods
    assert any(m[2].startswith("ours compiled at tau 6") for m in methods)
    assert any(m[2].startswith("transformers assisted") for m in methods)
    # acceptance pinned by construction: every draft accepted (tau = L + 1 = 6 in full rounds), or none
    by = {(r["shape"], r["batch"], r["method"]): r for r in rows}
    assert by["pair-q", 1, "ours eager, all accepted"]["tau"] > 3.0
    assert by["pair-q", 2, "ours eager, none accepted"]["tau"] == 1.0
    # the stop-read rows: the same rounds, plus the confidence stop's one read per drafted token (never stopping)
    for plain, watched in (("ours eager, all accepted", "ours eager, all accepted, stop read per draft"),
                           ("ours static cache, eager verify, all accepted",
                            "ours static cache, eager verify, stop read per draft, all accepted")):
        plain, watched = (next(r for r in rows if r["batch"] == 1 and r["method"].split(" (")[0] == m)
                          for m in (plain, watched))
        assert watched["rounds"] == plain["rounds"] and watched["tau"] == plain["tau"], (plain, watched)
        assert watched["engine_reads_per_round"] >= plain["engine_reads_per_round"] + 3, (plain, watched)


def test_bench_forward_compiled_step_smoke(tmp_path):
    """scripts/bench_forward.py --compile: the int8 row gets its compiled twin (one compile of a tiny model)."""
    Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2).save_pretrained(tmp_path / "tiny")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_forward.py"), "--random-weights", "--models",
         str(tmp_path / "tiny"), "--dtypes", "bfloat16", "--kernels", "int8", "--compile", "--positions", "1",
         "--repeats", "1", "--context", "8"], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith(f"| {tmp_path / 'tiny'} ")]
    assert [r.split(" | ")[2] for r in rows] == ["int8 weights on 15 layers",
                                                 "int8 weights on 15 layers, compiled step"], run.stdout
    assert all("x read (" in r for r in rows), run.stdout
