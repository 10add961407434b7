"""A saved drafter WITH an RDK kernel loads through ``trust_remote_code`` where hf_vocabspec cannot be imported
(the README promises saved drafters load without the package): a meta-path blocker makes every
``import hf_vocabspec...`` raise ImportError in the fresh process, and the shipped modeling.py / configuration.py must
not need it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from tiny import llama_config
from transformers import LlamaForCausalLM

from hf_vocabspec import trim_drafter
from hf_vocabspec.rdk import embedding_prior_kernel

ROOT = Path(__file__).resolve().parent.parent

FRESH = r'''
import sys, importlib.abc

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "hf_vocabspec" or name.startswith("hf_vocabspec."):
            raise ImportError(f"blocked for this test: {name}")
        return None

sys.meta_path.insert(0, Block())
try:
    import hf_vocabspec  # noqa: F401
    raise SystemExit("the blocker does not block")
except ImportError:
    pass

import torch
from transformers import AutoModelForCausalLM
drafter_dir, target_dir = sys.argv[1], sys.argv[2]
drafter = AutoModelForCausalLM.from_pretrained(drafter_dir, trust_remote_code=True)
assert type(drafter).__name__ == "TrimmedDrafter", type(drafter)
assert drafter.config.rdk and drafter.config.rdk["num_targets"] == 3, drafter.config.rdk
print("RDK", int(drafter.rdk_targets.sum()), float(drafter.rdk_weights.double().sum()))
target = AutoModelForCausalLM.from_pretrained(target_dir)
ids = torch.tensor([[1, 5, 9, 13, 7]])
plain = target.generate(ids, max_new_tokens=12, do_sample=False)
assisted = target.generate(ids, max_new_tokens=12, do_sample=False, assistant_model=drafter)
assert torch.equal(plain, assisted), (plain, assisted)
torch.manual_seed(0)
target.generate(ids, max_new_tokens=12, do_sample=True, assistant_model=drafter)  # sampling path runs too
assert not any(m == "hf_vocabspec" or m.startswith("hf_vocabspec.") for m in sys.modules)
print("STANDALONE-OK")
'''


def test_rdk_drafter_loads_with_trust_remote_code_without_the_package(tmp_path):
    torch.manual_seed(0)
    target = LlamaForCausalLM(llama_config(tie_word_embeddings=True)).eval()
    base = LlamaForCausalLM(llama_config(tie_word_embeddings=True)).eval()
    drafter = trim_drafter(base, torch.arange(3, 30))
    kernel = embedding_prior_kernel(drafter.get_input_embeddings().weight, drafter.d2t, pruned_mass=0.2, num_targets=3)
    drafter.set_rdk_kernel(kernel)
    drafter.save_pretrained(tmp_path / "drafter")
    target.save_pretrained(tmp_path / "target")
    saved = load_file(str(tmp_path / "drafter" / "model.safetensors"))
    config = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert config["auto_map"] == {"AutoConfig": "configuration.TrimmedDrafterConfig",
                                  "AutoModelForCausalLM": "modeling.TrimmedDrafter"}, config["auto_map"]
    for shipped in ("configuration.py", "modeling.py"):
        code = (tmp_path / "drafter" / shipped).read_text()
        assert "import hf_vocabspec" not in code and "from hf_vocabspec" not in code, shipped

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_MODULES_CACHE"] = str(tmp_path / "modules")  # a fresh copy of the shipped code, not a cached one
    proc = subprocess.run([sys.executable, "-c", FRESH, str(tmp_path / "drafter"), str(tmp_path / "target")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 0 and "STANDALONE-OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
    rdk_line = next(line for line in proc.stdout.splitlines() if line.startswith("RDK"))
    assert rdk_line == f"RDK {int(saved['rdk_targets'].sum())} {float(saved['rdk_weights'].double().sum())}"


FRESH_UNTIED = FRESH.split("drafter_dir, target_dir = sys.argv[1], sys.argv[2]")[0] + r'''
drafter_dir, target_dir = sys.argv[1], sys.argv[2]
drafter = AutoModelForCausalLM.from_pretrained(drafter_dir, trust_remote_code=True)
assert type(drafter).__name__ == "TrimmedDrafter", type(drafter)
assert drafter.supports_context_tokens and drafter.use_context_tokens
rows = drafter.context_head_rows(drafter.context_ids[:3])
print("CTX", drafter.config.context_head_size, float(rows.double().sum()))
target = AutoModelForCausalLM.from_pretrained(target_dir)
ids = torch.tensor([[1, 5, 9, 13, 7]])
plain = target.generate(ids, max_new_tokens=12, do_sample=False)
assert torch.equal(plain, target.generate(ids, max_new_tokens=12, do_sample=False, assistant_model=drafter))
assert not any(m == "hf_vocabspec" or m.startswith("hf_vocabspec.") for m in sys.modules)
print("STANDALONE-OK")
'''


def test_untied_drafter_with_kept_rows_loads_with_trust_remote_code_without_the_package(tmp_path):
    """The kept pruned rows of an untied head (``context_head``) load and validate in the shipped code alone."""
    torch.manual_seed(0)
    target = LlamaForCausalLM(llama_config()).eval()
    drafter = trim_drafter(LlamaForCausalLM(llama_config()).eval(), torch.arange(3, 30))
    assert drafter.config.context_head_size == llama_config().vocab_size - 30  # kept: 0..2 (specials) and 3..29
    drafter.save_pretrained(tmp_path / "drafter")
    target.save_pretrained(tmp_path / "target")
    saved = load_file(str(tmp_path / "drafter" / "model.safetensors"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_MODULES_CACHE"] = str(tmp_path / "modules")
    proc = subprocess.run([sys.executable, "-c", FRESH_UNTIED, str(tmp_path / "drafter"), str(tmp_path / "target")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 0 and "STANDALONE-OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("CTX"))
    assert line == f"CTX {drafter.config.context_head_size} {float(saved['context_head'][:3].double().sum())}"
