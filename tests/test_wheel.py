"""A regular (non-editable) install works: build the wheel, install it into a bare target directory, and in a
fresh interpreter run from elsewhere import it from THERE, build a model card (the template is package data)
and save/load a tiny trimmed drafter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r'''
import sys, tempfile
from pathlib import Path
import torch
import hf_vocabspec
from transformers import LlamaConfig, LlamaForCausalLM, AutoModelForCausalLM

target_dir = Path(sys.argv[1]).resolve()
assert Path(hf_vocabspec.__file__).resolve().is_relative_to(target_dir), hf_vocabspec.__file__
from hf_vocabspec.hub import TEMPLATE, build_model_card, model_origin
assert TEMPLATE.resolve().is_relative_to(target_dir) and TEMPLATE.is_file(), TEMPLATE
# the wheel's metadata carries the tested ranges (read back by _versions) and the offline-origin entry point
import importlib.metadata
from hf_vocabspec import _versions
dist = importlib.metadata.distribution("hf_vocabspec")
assert Path(dist.locate_file("hf_vocabspec/__init__.py")).resolve().is_relative_to(target_dir)
assert all(_versions.bounds(d)[1] for d in ("transformers", "optuna", "datasets", "accelerate")), "upper bounds"
_versions.check("transformers")
assert "hf_vocabspec.evaluation.offline" not in sys.modules
assert model_origin("offline:sharegpt")["hub_id"] == "anon8231489123/ShareGPT_Vicuna_unfiltered"

torch.manual_seed(0)
base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                    num_attention_heads=4, num_key_value_heads=2, eos_token_id=2, bos_token_id=1,
                                    pad_token_id=0))
drafter = hf_vocabspec.trim_drafter(base, torch.arange(3, 20))
card = build_model_card(drafter, "user/tiny-trimmed")
text = str(card)
assert "hf_vocabspec" in text and "user/tiny-trimmed" in text, text[:500]
with tempfile.TemporaryDirectory() as d:
    drafter.save_pretrained(d)
    back = AutoModelForCausalLM.from_pretrained(d)
    assert type(back).__name__ == "TrimmedDrafter" and torch.equal(back.d2t, drafter.d2t)
print("WHEEL-OK", hf_vocabspec.__file__)
'''


@pytest.mark.integration  # a wheel build takes ~20-40 s on 2 shared cores
def test_wheel_install_builds_a_card_and_round_trips_a_drafter(tmp_path):
    src = tmp_path / "src"  # build from a copy: an in-tree build would leave build/ and egg-info in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "hf_vocabspec", src / "hf_vocabspec", ignore=shutil.ignore_patterns("__pycache__"))
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)], check=True,
                   capture_output=True, text=True, timeout=600)
    (wheel,) = wheels.glob("hf_vocabspec-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "hf_vocabspec/templates/drafter_card.md" in names, "card template missing from the wheel"
    assert "hf_vocabspec/custom_generate/generate.py" in names or any("custom_generate" in n for n in names)
    tasks = "hf_vocabspec/evaluation/lmeval_tasks/"
    assert {tasks + "vocabspec_humaneval.yaml", tasks + "utils.py"} <= set(names), "lm-eval tasks missing from the wheel"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True,
                   capture_output=True, text=True, timeout=600)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(target)}
    # -I would also drop PYTHONPATH; -s keeps user site out; the venv's site-packages has hf_vocabspec only as an
    # editable finder, which PYTHONPATH (searched first) shadows; the assertion in SCRIPT proves which one loaded.
    proc = subprocess.run([sys.executable, "-s", "-c", SCRIPT, str(target)], cwd=elsewhere, env=env,
                          capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 0 and "WHEEL-OK" in proc.stdout, proc.stderr[-3000:]
