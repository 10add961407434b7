"""Counting under `accelerate launch` with 2 REAL processes gives counts identical to one process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_vocabspec.coverage import TokenCounts

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd, env_extra=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.integration
def test_two_processes_count_identically(tmp_path):
    args = ["count", "--tokenizer", "offline:smollm2-135m-instruct", "--dataset", "offline:sharegpt",
            "--max-examples", "301"]
    one = _run([str(BIN / "hf-vocabspec"), *args, "--output", str(tmp_path / "one.safetensors")])
    assert "counted on 1 process(es)" in one.stderr
    # NOTE: `accelerate launch --cpu --num_processes 2` starts ONE process; --multi_gpu with
    # PartialState(cpu=True) starts two via torchrun and forms a gloo group on a GPU-less machine.
    two = _run([str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
                "--main_process_port", str(_free_port()), "-m", "hf_vocabspec.cli", *args,
                "--output", str(tmp_path / "two.safetensors")], {"CUDA_VISIBLE_DEVICES": ""})
    assert "counted on 2 process(es)" in two.stderr
    a, b = TokenCounts.load(tmp_path / "one.safetensors"), TokenCounts.load(tmp_path / "two.safetensors")
    assert torch.equal(a.counts, b.counts)
    assert (a.num_examples, a.num_assistant_turns) == (b.num_examples, b.num_assistant_turns) == (301, a.num_assistant_turns)
