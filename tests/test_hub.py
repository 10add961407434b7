"""Hub round trip with the REAL huggingface_hub / transformers clients against a local Hub-compatible server.

Each client run is a fresh subprocess with HF_ENDPOINT pointing at the server (the clients read it at
import), so "push in one process, load by repo id in another" is tested literally.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hub_server import LocalHub
from tiny import make_pair

from hf_vocabspec import trim_drafter

PROMPT = [[1, 6, 9, 14, 3]]


@pytest.fixture(scope="module")
def hub():
    with LocalHub() as h:
        yield h


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    root = tmp_path_factory.mktemp("local")
    target, base = make_pair("llama", seed=11, head_scale=8.0)
    target.save_pretrained(root / "target")
    base.save_pretrained(root / "plain")
    drafter = trim_drafter(base, range(3, 50), target_model="tiny-target")
    drafter.save_pretrained(root / "drafter")
    ref = target.generate(torch.tensor(PROMPT), max_new_tokens=20, do_sample=False, assistant_model=drafter)
    return root, ref[0].tolist()


def run_client(hub, tmp_path, code: str, import_package: bool = True) -> dict:
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": "hf_dummy_token",
           "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "0"}
    header = "import json, torch" + (", hf_vocabspec" if import_package else "") + "\nresult = {}\n"
    script = header + textwrap.dedent(code) + "\nprint('RESULT' + json.dumps(result))"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):])


def test_push_then_fresh_process_loads_by_repo_id(hub, local, tmp_path):
    root, ref = local
    run_client(hub, tmp_path, f"""
        from hf_vocabspec import TrimmedDrafter
        from hf_vocabspec.hub import push_drafter_to_hub
        d = TrimmedDrafter.from_pretrained({str(root / 'drafter')!r})
        result['url'] = push_drafter_to_hub(d, 'user/tiny-drafter', license='apache-2.0')
        from transformers import AutoModelForCausalLM
        AutoModelForCausalLM.from_pretrained({str(root / 'plain')!r}).push_to_hub('user/plain-model')
    """)
    repo = hub.state.repos["user/tiny-drafter"]["commits"][-1][1]
    assert {"config.json", "model.safetensors", "README.md", "generation_config.json"} <= set(repo)
    card = repo["README.md"].decode()
    assert "hf_vocabspec" in card and "speculative-decoding" in card and "tiny-target" in card
    assert "license: apache-2.0" in card
    assert any(len(b) > 0 for b in hub.state.lfs.values())  # weights went through the LFS upload path

    got = run_client(hub, tmp_path, f"""
        from transformers import AutoModelForCausalLM
        from hf_vocabspec import TrimmedDrafter
        from hf_vocabspec.hub import load_drafter
        target = AutoModelForCausalLM.from_pretrained({str(root / 'target')!r})
        for name, loader in [("auto", AutoModelForCausalLM.from_pretrained), ("cls", TrimmedDrafter.from_pretrained),
                             ("hub", lambda r: load_drafter(r, target=target))]:
            d = loader('user/tiny-drafter')
            assert isinstance(d, TrimmedDrafter)
            out = target.generate(torch.tensor({PROMPT}), max_new_tokens=20, do_sample=False, assistant_model=d)
            result[name] = out[0].tolist()
        from huggingface_hub import hf_hub_download, snapshot_download
        import os
        result['snapshot'] = sorted(os.listdir(snapshot_download('user/tiny-drafter')))
        result['config_path'] = hf_hub_download('user/tiny-drafter', 'config.json')
    """)
    assert got["auto"] == got["cls"] == got["hub"] == ref
    assert "model.safetensors" in got["snapshot"] and got["config_path"].endswith("config.json")


def test_trust_remote_code_loads_without_the_package(hub, local, tmp_path):
    """The repo ships auto_map + drafter.py: users without hf_vocabspec load it with trust_remote_code."""
    root, ref = local
    if "user/tiny-drafter" not in hub.state.repos:
        pytest.skip("needs the pushed repo from the round-trip test")
    assert "drafter.py" in hub.state.repos["user/tiny-drafter"]["commits"][-1][1]
    got = run_client(hub, tmp_path, f"""
        import sys
        from transformers import AutoModelForCausalLM
        d = AutoModelForCausalLM.from_pretrained('user/tiny-drafter', trust_remote_code=True)
        target = AutoModelForCausalLM.from_pretrained({str(root / 'target')!r})
        result['imported'] = 'hf_vocabspec' in sys.modules
        result['module'] = type(d).__module__
        result['out'] = target.generate(torch.tensor({PROMPT}), max_new_tokens=20, do_sample=False,
                                        assistant_model=d)[0].tolist()
    """, import_package=False)
    assert not got["imported"] and got["module"].startswith("transformers_modules")
    assert got["out"] == ref


def test_errors_a_new_user_meets(hub, local, tmp_path):
    root, _ = local
    if "user/tiny-drafter" not in hub.state.repos:
        pytest.skip("needs the pushed repo from the round-trip test")
    got = run_client(hub, tmp_path, f"""
        from transformers import LlamaConfig, LlamaForCausalLM
        from hf_vocabspec.hub import load_drafter
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError
        def err(fn):
            try:
                fn()
            except Exception as e:
                return type(e).__name__ + ': ' + str(e)
            return 'no error'
        result['wrong_repo'] = err(lambda: load_drafter('user/does-not-exist'))
        result['plain_repo'] = err(lambda: load_drafter('user/plain-model'))
        other = LlamaForCausalLM(LlamaConfig(vocab_size=80, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1))
        result['mismatch'] = err(lambda: load_drafter('user/tiny-drafter', target=other))
        result['missing_file'] = err(lambda: hf_hub_download('user/tiny-drafter', 'nope.json'))
    """)
    assert "Could not load a drafter from 'user/does-not-exist'" in got["wrong_repo"]
    assert "not an hf_vocabspec trimmed drafter" in got["plain_repo"]
    assert "trimmed for a 64-token vocabulary" in got["mismatch"]
    assert got["missing_file"].startswith(("EntryNotFoundError", "RemoteEntryNotFoundError"))


@pytest.mark.skipif(not os.environ.get("HF_VOCABSPEC_REAL_HUB_TOKEN"), reason="opt-in: set HF_VOCABSPEC_REAL_HUB_TOKEN")
def test_real_hub_round_trip(local):  # pragma: no cover - needs network and a token
    from huggingface_hub import HfApi, whoami

    from hf_vocabspec import TrimmedDrafter
    from hf_vocabspec.hub import load_drafter, push_drafter_to_hub

    token = os.environ["HF_VOCABSPEC_REAL_HUB_TOKEN"]
    repo = f"{whoami(token)['name']}/hf-vocabspec-test-drafter"
    push_drafter_to_hub(TrimmedDrafter.from_pretrained(local[0] / "drafter"), repo, token=token, private=True)
    try:
        assert isinstance(load_drafter(repo, token=token), TrimmedDrafter)
    finally:
        HfApi(token=token).delete_repo(repo)
