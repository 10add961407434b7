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
from tiny import HUB_PROMPT as PROMPT
from tiny import VOCAB, greedy, make_pair, tiny_tokenizer

from hf_vocabspec import VocabularyMapError, trim_drafter
from hf_vocabspec.hub import (
    build_model_card,
    push_drafter_to_hub,
    write_custom_generate,
)

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
           "--dtype", "float32", "--weight-quantization", "int8", "--output", str(root / "out"),
           "--push-to-hub", "user/cli-drafter",
           "--license", "mit", "--bench-results", str(root / "bench.json")]
    bench = {"runs": [{"workload": "offline:sharegpt", "in_domain": True, "mode": "greedy", "methods": {
        f"trimmed k={n}{' +context' * ctx}": {"kept_vocab": n, "context_tokens": ctx, "acceptance_rate": n / 100}
        for n in range(30, 45) for ctx in (False, True)}}]}  # the drafter ships with context tokens when its head allows
    (root / "bench.json").write_text(json.dumps(bench))
    env = {**os.environ, **client_env(local_hub, root / "hf-cache-cli")}
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "pushed to" in proc.stdout

    files = local_hub.files("user/cli-drafter")
    assert {"config.json", "model.safetensors", "README.md", "custom_generate/generate.py"} <= set(files)
    card = files["README.md"].decode()
    assert "draft_step_speedup" in card and "coverage" in card and "model-index" in card
    local = AutoModelForCausalLM.from_pretrained(root / "out")
    assert local.config.weight_quantization == "int8" and local.quantized_layers > 0  # loads back quantized
    target = pushed["target"]
    ref = greedy(target, local)
    assert local.config.draft_vocab_size >= 30
    assert "license: mit" in card and f"value: {local.config.draft_vocab_size / 100}" in card  # this size's bench row

    got = run_fresh(f"""
        import json, torch
        import hf_vocabspec
        from hf_vocabspec.hub import load_drafter
        from transformers import AutoModelForCausalLM
        target = AutoModelForCausalLM.from_pretrained({str(pushed['root'] / 'target')!r})
        d = load_drafter('user/cli-drafter', target=target)
        out = target.generate(torch.tensor({PROMPT}), max_new_tokens=20, do_sample=False, assistant_model=d)
        print('RESULT' + json.dumps({{'out': out[0].tolist(), 'k': d.config.draft_vocab_size,
                                      'q': d.quantized_layers}}))
    """, local_hub, tmp_path)
    assert got["out"] == ref and got["k"] == local.config.draft_vocab_size and got["q"] == local.quantized_layers
    assert VOCAB == local.config.vocab_size


def _recipe_modules():
    return [m for k, m in sys.modules.items() if k.startswith("transformers_modules") and hasattr(m, "_LOADED")]


def test_custom_generate_drafter_kwarg_and_errors(pushed, tmp_path):
    """`drafter=` picks another trimmed drafter; a new user's mistakes give errors that name the fix."""
    from transformers import LlamaConfig, LlamaForCausalLM

    target = pushed["target"]
    pushed["drafter"].save_pretrained(tmp_path / "d")
    write_custom_generate(tmp_path / "d", str(tmp_path / "d"))
    _, base = make_pair("llama", seed=5, head_scale=8.0)
    trim_drafter(base, range(3, 30)).save_pretrained(tmp_path / "other")

    out = target.generate(torch.tensor(PROMPT), custom_generate=str(tmp_path / "d"), trust_remote_code=True,
                          drafter=str(tmp_path / "other"), max_new_tokens=20, do_sample=False)
    assert out[0].tolist() == pushed["ref"]
    used = [d for m in _recipe_modules() for (name, *_), d in m._LOADED.items() if name == str(tmp_path / "other")]
    assert used and used[0].config.draft_vocab_size == 27 + 3  # really the other drafter ...
    assert used[0].last_speculation_stats is not None and used[0].last_speculation_stats.proposed > 0  # ... drafting

    with pytest.raises(ValueError, match="trust_remote_code=True"):  # transformers' own gate
        target.generate(torch.tensor(PROMPT), custom_generate=str(tmp_path / "d"), max_new_tokens=5)
    other = LlamaForCausalLM(LlamaConfig(vocab_size=48, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))  # fewer rows than the ids
    with pytest.raises(VocabularyMapError, match="trimmed for a 64-token vocabulary"):
        other.generate(torch.tensor(PROMPT), custom_generate=str(tmp_path / "d"), trust_remote_code=True,
                       max_new_tokens=5)
    with pytest.raises(OSError, match="custom_generate"):  # a drafter saved without the recipe
        target.generate(torch.tensor(PROMPT), custom_generate=str(tmp_path / "other"), trust_remote_code=True,
                        max_new_tokens=5)


def test_push_without_recipe_and_with_extra_files(local_hub, pushed, tmp_path):  # noqa: F811
    from huggingface_hub import ModelCard

    png = tmp_path / "pareto.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\nnot-really")
    pareto = [{"k": k, "coverage": k / 64, "relative_cost": 0.5 + k / 128} for k in range(5, 64, 2)]
    pareto.append({"k": 40, "coverage": 0.6, "relative_cost": 0.9, "chosen": True})  # a dominated choice
    with clients_pointed_at(local_hub, tmp_path / "hf-cache"):
        push_drafter_to_hub(pushed["drafter"], "user/no-recipe", custom_generate=False, pareto=pareto,
                            extra_files={"selection/pareto.png": png})
        card = ModelCard.load("user/no-recipe")
        with pytest.raises(FileNotFoundError, match="extra_files"):
            push_drafter_to_hub(pushed["drafter"], "user/no-recipe", extra_files={"x.png": tmp_path / "nope.png"})
    files = local_hub.files("user/no-recipe")
    assert not any(f.startswith("custom_generate/") for f in files)
    assert files["selection/pareto.png"] == png.read_bytes()
    assert "custom_generate" not in card.data.tags and "custom_generate=" not in card.content
    assert "![coverage vs draft cost" in card.content and "](selection/pareto.png)" in card.content
    rows = [ln for ln in card.content.splitlines() if ln.startswith("| ") and ln.count("|") == 5 and "%" in ln]
    assert 2 <= len(rows) <= 15 and rows[0].startswith("| 5 | 7.81% | 0.539 |")  # thinned, ends kept
    assert rows[-1].startswith("| 63 |")
    assert "| 40 | 60.00% | 0.900 | **chosen** (off the front) |" in rows


BENCH = {"runs": [
    {"workload": "offline:sharegpt", "in_domain": True, "mode": "greedy", "methods": {
        "target only": {"acceptance_rate": None, "speedup_vs_target": {"median": 1.0}},
        "trimmed k=44": {"kept_vocab": 44, "acceptance_rate": 0.8812, "mean_accepted_length": 4.2,
                         "speedup_vs_target": {"median": 1.31}, "speedup_vs_hf_assisted": {"median": 1.12},
                         "eval_coverage": 0.97},
        "trimmed k=44 +context": {"kept_vocab": 44, "context_tokens": True, "acceptance_rate": 0.9333},
        "trimmed k=20": {"kept_vocab": 20, "acceptance_rate": 0.5}}},
    {"workload": "offline:humaneval", "in_domain": False, "mode": "t0.7", "methods": {
        "trimmed k=44": {"kept_vocab": 44, "acceptance_rate": 0.7}}},
]}


def test_card_metadata_inherited_and_measured(local_hub, tmp_path):  # noqa: F811
    """Licence and Hub ids inherited from offline names; eval results from config and from a bench report."""
    from huggingface_hub import ModelCard

    from hf_vocabspec.evaluation.benchmark import eval_results_from_benchmark
    from hf_vocabspec.hub import EvalResultRow

    _, base = make_pair("llama", seed=5, head_scale=8.0)
    drafter = trim_drafter(base, range(3, 44), target_model="offline:smollm2-135m-instruct",
                           selection={"k": 41, "coverage": 0.9, "dataset": "offline:sharegpt"})
    drafter.config.base_drafter = "offline:gemma-3-270m"  # licences differ -> "other", both listed
    drafter.config.eval_results = [{"metric_type": "coverage", "metric_value": 0.9, "dataset_name": "cfg"}]
    drafter.config.context_tokens = False  # (untied heads keep context tokens now) the card takes the plain rows
    rows = eval_results_from_benchmark(BENCH, 44)
    assert all(isinstance(r, EvalResultRow) for r in rows)  # typed rows: the card code never reads results.json
    assert {(r.dataset_name, r.metric_type) for r in rows} >= {
        ("offline:sharegpt (held-out, greedy)", "acceptance_rate"), ("offline:humaneval (t0.7)", "acceptance_rate"),
        ("offline:sharegpt (held-out, greedy)", "speedup_vs_hf_assisted")}
    assert all(r.metric_value not in (0.5, 0.9333) for r in rows)  # not k=20's, nor the +context rows
    ctx = eval_results_from_benchmark(BENCH, 44, context_tokens=True)
    assert [r.metric_value for r in ctx] == [0.9333]  # a drafter shipped with context tokens on
    with pytest.raises(ValueError, match="several trimmed sizes"):
        eval_results_from_benchmark(BENCH)
    with pytest.raises(ValueError, match="bench --ks"):
        eval_results_from_benchmark(BENCH, 99)

    with clients_pointed_at(local_hub, tmp_path / "hf-cache"):
        push_drafter_to_hub(drafter, "user/inherited", eval_results=drafter.config.eval_results + rows)
        card = ModelCard.load("user/inherited")
    assert card.data.license == "other"
    assert "`apache-2.0`" in card.content and "`gemma`" in card.content
    assert card.data.base_model == "google/gemma-3-270m"
    assert card.data.target_model_hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert card.data.datasets == ["anon8231489123/ShareGPT_Vicuna_unfiltered"]
    got = {(r.dataset_name, r.metric_type): r.metric_value for r in card.data.eval_results}
    assert got[("cfg", "coverage")] == 0.9  # from config.eval_results
    assert got[("offline:sharegpt (held-out, greedy)", "speedup_vs_target")] == 1.31
    assert got[("offline:humaneval (t0.7)", "acceptance_rate")] == 0.7
    types = {r.dataset_name: r.dataset_type for r in card.data.eval_results}
    assert types["offline:sharegpt (held-out, greedy)"] == "anon8231489123/ShareGPT_Vicuna_unfiltered"
    assert types["offline:humaneval (t0.7)"] == "openai/openai_humaneval" and types["cfg"] == "cfg"
    assert 'from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")' in card.content  # usage names a real id

    drafter.config.base_drafter = drafter.config.target_model = "offline:smollm2-135m-instruct"
    assert build_model_card(drafter, "me/x").data.license == "apache-2.0"  # one licence: inherited as is
    assert build_model_card(drafter, "me/x", license="mit").data.license == "mit"  # explicit wins


@pytest.mark.integration
def test_smollm2_cli_push_then_fresh_process_by_repo_id(local_hub, tmp_path):  # noqa: F811
    """Done-criterion on a real model: `hf-vocabspec trim --push-to-hub` (search with the FLOPs cost model) ->
    repo with card, Pareto data and recipe on the local Hub -> a fresh process loads it by repo id and decodes
    greedily exactly like the locally saved copy, both with assistant_model= and with custom_generate=."""
    from huggingface_hub import ModelCard

    from hf_vocabspec.evaluation.offline import load_model, load_tokenizer

    smol, repo = "offline:smollm2-135m-instruct", "user/smollm2-135m-trimmed"
    cmd = [sys.executable, "-m", "hf_vocabspec.cli", "trim", "--drafter", smol, "--target", smol,
           "--dataset", "offline:sharegpt", "--max-examples", "300", "--min-coverage", "0.9", "--cost", "flops",
           "--n-trials", "12", "--max-k", "20000", "--dtype", "float32", "--output", str(tmp_path / "out"),
           "--push-to-hub", repo]
    env = {**os.environ, **client_env(local_hub, tmp_path / "hf-cache-cli")}
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]

    files = local_hub.files(repo)
    assert {"config.json", "model.safetensors", "README.md", "custom_generate/generate.py",
            "selection/pareto.png", "selection/selection.json", "tokenizer.json"} <= set(files)
    with clients_pointed_at(local_hub, tmp_path / "hf-cache"):
        card = ModelCard.load(repo)
    assert card.data.license == "apache-2.0" and card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert {r.metric_type for r in card.data.eval_results} == {"coverage", "draft_step_speedup"}
    assert "**chosen**" in card.content and "custom_generate" in card.data.tags

    tok = load_tokenizer(smol)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Give me three tips for writing clean code."}],
                                     add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    target = load_model(smol).eval()
    from transformers import AutoModelForCausalLM

    local = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ref = target.generate(prompt, assistant_model=local, max_new_tokens=40, do_sample=False)[0].tolist()
    assert ref == target.generate(prompt, max_new_tokens=40, do_sample=False)[0].tolist()

    got = run_fresh(f"""
        import json, torch
        from hf_vocabspec.hub import load_drafter
        from hf_vocabspec.evaluation.offline import load_model, load_tokenizer
        target = load_model({smol!r}).eval()
        d = load_drafter({repo!r}, target=target, tokenizer=load_tokenizer({smol!r}))
        ids = torch.tensor({prompt.tolist()})
        a = target.generate(ids, assistant_model=d, max_new_tokens=40, do_sample=False)[0].tolist()
        b = target.generate(ids, custom_generate={repo!r}, trust_remote_code=True, max_new_tokens=40,
                            do_sample=False)[0].tolist()
        print('RESULT' + json.dumps({{'a': a, 'b': b, 'k': d.config.draft_vocab_size,
                                      'accepted': d.last_speculation_stats.accepted}}))
    """, local_hub, tmp_path)
    assert got["a"] == ref and got["b"] == ref
    assert got["k"] == local.config.draft_vocab_size < local.config.vocab_size
    assert got["accepted"] > 0
