"""Hub round trip with the REAL huggingface_hub / transformers clients against a local Hub-compatible server.

Most tests point this process's clients at the server (``hub_client``); one runs a fresh subprocess with
HF_ENDPOINT in its environment, so "push in one process, load by repo id in another" is tested literally.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hub_server import client_env, clients_pointed_at, hub_client, local_hub  # noqa: F401 - fixtures
from tiny import VOCAB, greedy, make_pair, tiny_tokenizer

from hf_vocabspec import (
    TrimmedDrafter,
    VocabularyMapError,
    tokenizer_sha256,
    trim_drafter,
)
from hf_vocabspec.hub import (
    DrafterFileMissingError,
    DrafterLoadError,
    DrafterMismatchError,
    DrafterNotFoundError,
    NotATrimmedDrafterError,
    build_model_card,
    load_drafter,
    push_drafter_to_hub,
)

PROMPT = [[1, 6, 9, 14, 3]]
REPO = "user/tiny-drafter"
PLAIN = "user/plain-model"
SELECTION = {"k": 47, "coverage": 0.9512, "min_coverage": 0.95, "dataset": "offline:sharegpt"}


@pytest.fixture(scope="module")
def pushed(local_hub, tmp_path_factory):  # noqa: F811
    """Push a trimmed drafter (with tokenizer) and a plain model to the local Hub once for the module."""
    root = tmp_path_factory.mktemp("local")
    target, base = make_pair("llama", seed=11, head_scale=8.0)
    tok = tiny_tokenizer()
    drafter = trim_drafter(base, range(3, 50), tokenizer=tok, target_model="org/tiny-target", selection=SELECTION)
    target.save_pretrained(root / "target")
    drafter.save_pretrained(root / "drafter")
    with clients_pointed_at(local_hub, root / "hf-cache"):
        url = push_drafter_to_hub(drafter, REPO, tokenizer=tok, license="apache-2.0", commit_message="Add tiny drafter")
        base.push_to_hub(PLAIN)  # transformers' own push_to_hub against the same server
    return {"root": root, "target": target, "drafter": drafter, "tok": tok, "url": url, "ref": greedy(target, drafter)}


def test_push_writes_weights_and_card_in_one_commit(local_hub, pushed):  # noqa: F811
    assert pushed["url"].endswith(REPO)
    files = local_hub.files(REPO)
    assert {"config.json", "model.safetensors", "generation_config.json", "README.md", "tokenizer.json"} <= set(files)
    assert local_hub.state.commit_messages(REPO) == ["initial commit", "Add tiny drafter"]
    assert local_hub.state.lfs  # weights went through the LFS batch + PUT path
    config = json.loads(files["config.json"])
    assert config["model_type"] == "hf_vocabspec_trimmed_drafter" and config["draft_vocab_size"] == 47 + 3
    assert config["target_tokenizer_sha256"] == tokenizer_sha256(pushed["tok"])
    card = files["README.md"].decode()
    assert card.startswith("---\n") and "library_name: transformers" in card and "license: apache-2.0" in card
    assert "org/tiny-target" in card and "import hf_vocabspec" in card and "assistant_model=drafter" in card
    assert "95.12%" in card  # selection metadata rendered


def test_card_yaml_reads_back_through_the_client(hub_client, pushed):  # noqa: F811
    from huggingface_hub import ModelCard

    card = ModelCard.load(REPO)  # hf_hub_download of README.md, YAML parsed by the client
    assert card.data.library_name == "transformers"
    assert {"hf_vocabspec", "speculative-decoding"} <= set(card.data.tags)
    assert card.data.draft_vocab_size == 50 and card.data.vocab_size == VOCAB
    assert card.data.target_model == "org/tiny-target" and card.data.pipeline_tag == "text-generation"


def test_load_by_repo_id_generates_identically(hub_client, pushed):  # noqa: F811
    from transformers import AutoModelForCausalLM

    target, ref = pushed["target"], pushed["ref"]
    loaders = {
        "cls": lambda: TrimmedDrafter.from_pretrained(REPO),
        "auto": lambda: AutoModelForCausalLM.from_pretrained(REPO),
        "hub": lambda: load_drafter(REPO, target=target, tokenizer=pushed["tok"]),
    }
    for name, load in loaders.items():
        d = load()
        assert isinstance(d, TrimmedDrafter), name
        assert torch.equal(d.d2t, pushed["drafter"].d2t), name
        # the untied base's pruned rows travel with the push: context tokens stay on after loading by repo id
        assert d.use_context_tokens and torch.equal(d.context_head, pushed["drafter"].context_head), name
        assert greedy(target, d) == ref, name


def test_snapshot_and_file_download(hub_client, pushed):  # noqa: F811
    from huggingface_hub import HfApi, file_exists, hf_hub_download, snapshot_download

    snap = snapshot_download(REPO)
    assert {"config.json", "model.safetensors", "README.md"} <= set(os.listdir(snap))
    assert TrimmedDrafter.from_pretrained(snap).config.draft_vocab_size == 50
    cfg_path = hf_hub_download(REPO, "config.json")
    assert json.loads(Path(cfg_path).read_text())["draft_vocab_size"] == 50
    info = HfApi().model_info(REPO, files_metadata=False)
    assert "model.safetensors" in {s.rfilename for s in info.siblings}
    assert file_exists(REPO, "README.md") and not file_exists(REPO, "nope.json")
    # pinned to the commit sha: the same files resolve
    assert hf_hub_download(REPO, "config.json", revision=info.sha) == cfg_path


def test_errors_a_new_user_meets(hub_client, pushed):  # noqa: F811
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError
    from transformers import LlamaConfig, LlamaForCausalLM

    with pytest.raises(DrafterNotFoundError, match="no such repo"):
        load_drafter("user/does-not-exist")
    with pytest.raises(DrafterNotFoundError, match="no such revision"):
        load_drafter(REPO, revision="no-such-branch")
    for bad in ("my drafter", "./not-saved-yet", "a/b/c"):  # neither a directory nor a valid repo id
        with pytest.raises(DrafterNotFoundError, match="neither a local directory nor a valid Hub repo id"):
            load_drafter(bad)
    with pytest.raises(DrafterLoadError, match="is a file: pass the directory"):
        load_drafter(pushed["root"] / "drafter" / "config.json")
    with pytest.raises(DrafterFileMissingError, match="without config.json"):
        load_drafter(pushed["root"])
    with pytest.raises(NotATrimmedDrafterError, match="not an hf_vocabspec trimmed drafter") as err:
        load_drafter(PLAIN)
    assert "'llama'" in str(err.value) and "trim_drafter" in str(err.value)

    def target(rows):
        return LlamaForCausalLM(LlamaConfig(vocab_size=rows, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=1))

    with pytest.raises(DrafterMismatchError, match="trimmed for a 64-token vocabulary .* has 48 rows") as err:
        load_drafter(REPO, target=target(48))  # fewer rows than the drafter's ids
    assert isinstance(err.value, VocabularyMapError) and "\n" not in str(err.value)
    # a target padded past the tokenizer (more rows, the same tokenizer) is compatible, confirmed or not
    assert load_drafter(REPO, target=target(80)).config.vocab_size == 64
    assert load_drafter(REPO, target=target(80), tokenizer=pushed["tok"]).config.vocab_size == 64
    with pytest.raises(DrafterMismatchError, match="token->id tables differ"):
        load_drafter(REPO, tokenizer=tiny_tokenizer(shuffle=True))

    with pytest.raises(EntryNotFoundError):  # RemoteEntryNotFoundError from the server's X-Error-Code
        hf_hub_download(REPO, "nope.json")
    # a trimmed-drafter config without weights: an incomplete upload
    api = HfApi()
    api.create_repo("user/no-weights", exist_ok=True)
    api.upload_file(path_or_fileobj=hf_hub_download(REPO, "config.json"), path_in_repo="config.json",
                    repo_id="user/no-weights")
    with pytest.raises(DrafterFileMissingError, match="no weights") as err:
        load_drafter("user/no-weights")
    assert isinstance(err.value, EntryNotFoundError)
    # a repo with no config.json at all
    api.create_repo("user/empty", exist_ok=True)
    with pytest.raises(DrafterFileMissingError, match="no config.json"):
        load_drafter("user/empty")


def test_push_refuses_a_foreign_tokenizer(hub_client, pushed):  # noqa: F811
    with pytest.raises(DrafterMismatchError):
        push_drafter_to_hub(pushed["drafter"], "user/should-not-exist", tokenizer=tiny_tokenizer(shuffle=True))
    assert "user/should-not-exist" not in hub_client.state.repos


def test_model_card_without_selection_and_offline_base():
    _, base = make_pair("llama", seed=3)
    base.config._name_or_path = "/some/local/path"
    drafter = trim_drafter(base, [3, 4, 5])
    card = build_model_card(drafter, "me/x")
    assert card.data.base_model is None  # a local path is not a Hub id: kept out of the YAML
    assert "/some/local/path" in card.content and "No selection metadata was recorded." in card.content
    assert card.data.draft_vocab_size == drafter.config.draft_vocab_size
    assert "## Context tokens" in card.content and "pruned rows are kept in the `context_head`" in card.content
    bare = trim_drafter(base, [3, 4, 5], keep_pruned_rows=False)  # untied base without its pruned rows
    assert "## Context tokens" not in build_model_card(bare, "me/x").content


def test_model_card_takes_typed_eval_results_and_never_reads_a_bench_report():
    """issue #29: the card code takes EvalResultRow (or dicts of its fields, as config.eval_results stores them);
    reading the bench's results.json is the tooling's job (evaluation.benchmark.eval_results_from_benchmark)."""
    import inspect

    import hf_vocabspec.hub as hub
    from hf_vocabspec.hub import EvalResultRow

    _, base = make_pair("llama", seed=3)
    drafter = trim_drafter(base, [3, 4, 5])
    typed = EvalResultRow(metric_type="acceptance_rate", metric_value=0.8, dataset_name="offline:sharegpt (greedy)")
    card = build_model_card(drafter, "me/x", eval_results=[typed, {"metric_type": "coverage", "metric_value": 0.9,
                                                                   "dataset_name": "cfg"}])
    got = {r.metric_type: r for r in card.data.eval_results}
    assert got["acceptance_rate"].metric_value == 0.8 and got["acceptance_rate"].metric_name == "acceptance_rate"
    assert got["coverage"].dataset_type == "cfg"
    assert EvalResultRow.from_dict(typed.to_dict()) == typed and "source_url" not in typed.to_dict()
    with pytest.raises(ValueError, match=r"need \['metric_value'\]"):
        EvalResultRow.from_dict({"metric_type": "x", "dataset_name": "y"})
    assert "benchmark" not in inspect.signature(push_drafter_to_hub).parameters
    assert not hasattr(hub, "eval_results_from_benchmark")


def test_model_card_describes_context_tokens_of_a_tied_drafter():
    _, base = make_pair("gemma3", seed=3)
    drafter = trim_drafter(base, [3, 4, 5])
    assert drafter.config.context_tokens  # on by default for tied embeddings
    assert "## Context tokens" in build_model_card(drafter, "me/x").content
    drafter.config.context_tokens = False
    assert "## Context tokens" not in build_model_card(drafter, "me/x").content


def test_fresh_process_loads_by_repo_id_with_trust_remote_code(local_hub, pushed, tmp_path):  # noqa: F811
    """A process that never imports hf_vocabspec loads the pushed repo by id (shipped modeling.py and
    configuration.py + auto_map)."""
    if "modeling.py" not in local_hub.files(REPO):
        pytest.skip("this checkpoint format ships no modeling.py")
    root = pushed["root"]
    script = textwrap.dedent(f"""
        import json, sys, torch
        sys.modules['hf_vocabspec'] = None  # as if the package were not installed: any import of it fails
        from transformers import AutoModelForCausalLM
        try:  # what a user without hf_vocabspec sees first
            AutoModelForCausalLM.from_pretrained({REPO!r})
            refusal = None
        except Exception as err:
            refusal = str(err)
        d = AutoModelForCausalLM.from_pretrained({REPO!r}, trust_remote_code=True)
        target = AutoModelForCausalLM.from_pretrained({str(root / 'target')!r})
        out = target.generate(torch.tensor({PROMPT}), max_new_tokens=20, do_sample=False, assistant_model=d)
        print('RESULT' + json.dumps({{'imported': sys.modules.get('hf_vocabspec') is not None, 'module': type(d).__module__,
                                      'out': out[0].tolist(), 'refusal': refusal}}))
    """)
    env = {**os.environ, **client_env(local_hub, tmp_path / "hf-cache")}
    proc = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, env=env, timeout=300,
                          stdin=subprocess.DEVNULL)  # the trust_remote_code prompt must not wait for a terminal
    assert proc.returncode == 0, proc.stderr[-4000:]
    # (transformers' trust_remote_code prompt ends without a newline, so RESULT may follow it on one line)
    got = json.loads([ln for ln in proc.stdout.splitlines() if "RESULT{" in ln][-1].split("RESULT", 1)[1])
    assert not got["imported"] and got["module"].startswith("transformers_modules")
    assert got["out"] == pushed["ref"]
    assert got["refusal"] and "trust_remote_code=True" in got["refusal"]


def _hub_reachable() -> bool:
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
        return True
    except OSError:
        return False


@pytest.mark.skipif(not os.environ.get("HF_TOKEN") or not _hub_reachable(),
                    reason="opt-in: needs HF_TOKEN and network access to huggingface.co")
def test_real_hub_round_trip(pushed):  # pragma: no cover - needs network and a token
    from huggingface_hub import HfApi

    token = os.environ["HF_TOKEN"]
    api = HfApi(token=token)
    repo = f"{api.whoami()['name']}/hf-vocabspec-test-drafter-{os.getpid()}"
    push_drafter_to_hub(pushed["drafter"], repo, tokenizer=pushed["tok"], token=token, private=True)
    try:
        loaded = load_drafter(repo, token=token, target=pushed["target"], tokenizer=pushed["tok"])
        assert greedy(pushed["target"], loaded) == pushed["ref"]
    finally:
        api.delete_repo(repo)



def test_offline_origins_come_from_the_registry_without_the_core_importing_the_tooling():
    """A fresh process: importing the core loads no tooling; the first ``offline:`` name looked up runs the
    ``hf_vocabspec.origins`` entry point (from the installed metadata), which registers the Hub origins."""
    import importlib.metadata

    entries = importlib.metadata.entry_points(group="hf_vocabspec.origins", name="offline")
    if not entries:
        pytest.skip("installed hf_vocabspec metadata predates the hf_vocabspec.origins entry point: reinstall")
    code = textwrap.dedent("""
        import sys
        import hf_vocabspec.hub as hub
        assert not any(m.startswith(("hf_vocabspec.evaluation", "hf_vocabspec.cli")) for m in sys.modules), "tooling"
        print(hub.model_origin("offline:sharegpt")["hub_id"], hub.model_origin("offline:nope")["hub_id"])
        print("hf_vocabspec.evaluation.offline" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["anon8231489123/ShareGPT_Vicuna_unfiltered", "None", "True"]
