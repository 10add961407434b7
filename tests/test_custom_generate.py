"""custom_generate recipe, model-index eval results, and the CLI push -> fresh-process load path.

All against the local Hub-compatible server with the real huggingface_hub / transformers clients; the
"user" side always runs in a FRESH subprocess that only knows the repo id.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hub_server import client_env, clients_pointed_at, hub_client, local_hub  # noqa: F401 - fixtures
from test_hub import PROMPT, greedy, tiny_tokenizer
from tiny import VOCAB, make_pair

from hf_vocabspec import trim_drafter
from hf_vocabspec.hub import build_model_card, push_drafter_to_hub, write_custom_generate

REPO = "user/tiny-drafter-cg"
RESULTS = [{"metric_type": "acceptance_rate", "metric_value": 0.931, "dataset_name": "offline:sharegpt (held-out)"},
           {"metric_type": "speedup_vs_hf_assisted", "metric_value": 1.27, "dataset_name": "offline:sharegpt (held-out)",
            "metric_name": "tokens/s vs HF assisted (same drafter)"}]


def run_fresh(script: str, hub, tmp_path) -> dict:
    env = {**os.environ, **client_env(hub, tmp_path / "hf-cache-fresh")}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], check=False, capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1][len("RESULT"):])


@pytest.fixture(scope="module")
def pushed(local_hub, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("cg")
    target, base = make_pair("llama", seed=5, head_scale=8.0)
    tok = tiny_tokenizer()
    drafter = trim_drafter(base, range(3, 44), tokenizer=tok, target_model="org/tiny-target")
    target.save_pretrained(root / "target")
    with clients_pointed_at(local_hub, root / "hf-cache"):
        push_drafter_to_hub(drafter, REPO, tokenizer=tok, eval_results=RESULTS)
    return {"root": root, "target": target, "drafter": drafter, "ref": greedy(target, drafter)}


def test_push_ships_the_recipe(local_hub, pushed):  # noqa: F811
    files = local_hub.files(REPO)
    code = files["custom_generate/generate.py"].decode()
    assert f'DRAFTER_REPO = "{REPO}"' in code and "{{" not in code
    assert "custom_generate/requirements.txt" not in files  # would make the package required to load the drafter


def test_custom_generate_in_a_fresh_process_is_identical(local_hub, pushed, tmp_path):  # noqa: F811
    got = run_fresh(f"""
        import json, torch
        from transformers import AutoModelForCausalLM
        target = AutoModelForCausalLM.from_pretrained({str(pushed['root'] / 'target')!r})
        ids = torch.tensor({PROMPT})
        out = target.generate(ids, custom_generate={REPO!r}, trust_remote_code=True, max_new_tokens=20,
                              do_sample=False)
        plain = target.generate(ids, max_new_tokens=20, do_sample=False)
        from hf_vocabspec import TrimmedDrafter
        d = [v for k, v in __import__('sys').modules.items() if k.startswith('transformers_modules')]
        stats = None
        for mod in d:
            for val in getattr(mod, '_LOADED', {{}}).values():
                stats = val.last_speculation_stats.accepted if val.last_speculation_stats else None
        print('RESULT' + json.dumps({{'out': out[0].tolist(), 'plain': plain[0].tolist(), 'accepted': stats}}))
    """, local_hub, tmp_path)
    assert got["out"] == pushed["ref"] == got["plain"]
    assert got["accepted"] is not None and got["accepted"] > 0  # the trimmed drafter really drafted


def test_custom_generate_from_a_local_directory(pushed, tmp_path):
    target, drafter = pushed["target"], pushed["drafter"]
    drafter.save_pretrained(tmp_path / "d")
    write_custom_generate(tmp_path / "d", str(tmp_path / "d"))
    out = target.generate(torch.tensor(PROMPT), custom_generate=str(tmp_path / "d"), trust_remote_code=True,
                          max_new_tokens=20, do_sample=False)
    assert out[0].tolist() == pushed["ref"]
    with pytest.raises(ValueError, match="brings its own assistant"):
        target.generate(torch.tensor(PROMPT), custom_generate=str(tmp_path / "d"), trust_remote_code=True,
                        max_new_tokens=5, assistant_model=drafter)


def test_card_model_index_reads_back(hub_client, pushed):  # noqa: F811
    from huggingface_hub import ModelCard

    card = ModelCard.load(REPO)
    results = {r.metric_type: r for r in card.data.eval_results}
    assert results["acceptance_rate"].metric_value == 0.931
    assert results["speedup_vs_hf_assisted"].metric_name == "tokens/s vs HF assisted (same drafter)"
    assert results["acceptance_rate"].dataset_name == "offline:sharegpt (held-out)"
    assert "model-index" in card.content and "custom_generate=" in card.content
    assert "| offline:sharegpt (held-out) | acceptance_rate | 0.931 |" in card.content
    with pytest.raises(ValueError, match="metric_value"):
        build_model_card(pushed["drafter"], REPO, eval_results=[{"metric_type": "x", "dataset_name": "y"}])


def test_cli_trim_push_to_hub_then_fresh_process_generates_identically(local_hub, pushed, tmp_path):  # noqa: F811
    """The issue's done-criterion: `hf-vocabspec trim --push-to-hub` -> card on the server -> a fresh
    process loads the drafter by repo id and generates exactly what the locally saved copy generates."""
    from transformers import AutoModelForCausalLM

    root = tmp_path
    _, base = make_pair("llama", seed=5, head_scale=8.0)
    base.save_pretrained(root / "base")
    tiny_tokenizer().save_pretrained(root / "base")
    rows = [{"messages": [{"role": "user", "content": "w3 w4"},
                          {"role": "assistant", "content": " ".join(f"w{3 + (i * j) % 40}" for j in range(30))}]}
            for i in range(40)]
    (root / "chat.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cmd = [sys.executable, "-m", "hf_vocabspec.cli", "trim", "--drafter", str(root / "base"),
           "--target", str(pushed["root"] / "target"), "--dataset", str(root / "chat.jsonl"), "--k", "30",
           "--dtype", "float32", "--output", str(root / "out"), "--push-to-hub", "user/cli-drafter"]
    env = {**os.environ, **client_env(local_hub, root / "hf-cache-cli")}
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "pushed to" in proc.stdout

    files = local_hub.files("user/cli-drafter")
    assert {"config.json", "model.safetensors", "README.md", "custom_generate/generate.py"} <= set(files)
    card = files["README.md"].decode()
    assert "draft_step_speedup" in card and "coverage" in card and "model-index" in card
    local = AutoModelForCausalLM.from_pretrained(root / "out")
    target = pushed["target"]
    ref = greedy(target, local)
    assert local.config.draft_vocab_size >= 30

    got = run_fresh(f"""
        import json, torch
        import hf_vocabspec
        from hf_vocabspec.hub import load_drafter
        from transformers import AutoModelForCausalLM
        target = AutoModelForCausalLM.from_pretrained({str(pushed['root'] / 'target')!r})
        d = load_drafter('user/cli-drafter', target=target)
        out = target.generate(torch.tensor({PROMPT}), max_new_tokens=20, do_sample=False, assistant_model=d)
        print('RESULT' + json.dumps({{'out': out[0].tolist(), 'k': d.config.draft_vocab_size}}))
    """, local_hub, tmp_path)
    assert got["out"] == ref and got["k"] == local.config.draft_vocab_size
    assert VOCAB == local.config.vocab_size
