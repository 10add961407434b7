"""compare_methods on tiny models: counts, in-situ forward timing, zero-cost limit, Method.attrs, reports."""

from __future__ import annotations

import pytest
import torch
from tiny import VOCAB, make_pair

from hf_vocabspec import trim_drafter
from hf_vocabspec.cli import build_parser
from hf_vocabspec.evaluation.benchmark import (
    Method,
    MethodResult,
    applied_attrs,
    compare_methods,
    format_report,
    format_table,
    generation_config_for,
    machine_info,
    method_rows,
    timing_problem,
)

PROMPTS = [torch.tensor([[1, 6, 9, 14, 50, 55]]), torch.tensor([[1, 20, 21, 60, 3]])]  # 50, 55, 60 are pruned
REPEATS = 2
NEW_COLUMNS = ("verify ms", "draft ms/token", "time target/draft/other", "zero-cost limit (x target)",
               "share of limit", "theory (x target)")


def _assistant_config(model) -> None:
    gen = model.generation_config
    gen.num_assistant_tokens, gen.num_assistant_tokens_schedule, gen.assistant_confidence_threshold = 4, "constant", 0.0


@pytest.fixture(scope="module")
def run():
    """One interleaved run of target only, HF assisted, and one trimmed drafter shared by two switch settings."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny forwards: threads only add contention noise on a shared CPU
    target, base = make_pair("gemma3", seed=3, head_scale=8.0)  # tied embeddings: context tokens supported
    _, plain = make_pair("gemma3", seed=3, head_scale=8.0)
    _assistant_config(plain)
    drafter = trim_drafter(base, range(VOCAB - 12))
    drafter.use_context_tokens = "default"  # a sentinel: each method's switch must be restored to it
    drafter.generation_config.num_assistant_tokens = 4
    seen = []  # (use_context_tokens, probe) as the drafter body sees them during generate
    hook = drafter.model.register_forward_pre_hook(
        lambda *_: seen.append((drafter.use_context_tokens, getattr(drafter, "probe", None))))
    methods = [Method("target only"), Method("HF assisted", plain),
               Method("trimmed", drafter, attrs={"use_context_tokens": False}),
               Method("trimmed +context", drafter, attrs={"use_context_tokens": True, "probe": "ctx"})]
    try:
        results = compare_methods(target, methods, PROMPTS, max_new_tokens=20, repeats=REPEATS,
                                  generate_kwargs={"do_sample": False})
    finally:
        hook.remove()
        torch.set_num_threads(threads)
    return results, drafter, seen


def test_counts_are_consistent_and_greedy_outputs_identical(run):
    results, _, _ = run
    calls = REPEATS * len(PROMPTS)
    ref = results["target only"].outputs
    for name, r in results.items():
        assert r.outputs == ref, name
        assert r.new_tokens == REPEATS * sum(len(o) for o in r.outputs) > 0
        if not r.speculative:
            assert len(r.target_step_s) + calls == r.new_tokens  # prefill yields the first token, one decode per other
            continue
        assert r.rounds > 0 and 0 < r.accepted <= r.proposed
        assert len(r.target_step_s) + calls == r.rounds  # one verify forward per round, the first is the prefill
        assert len(r.draft_step_s) + calls == r.proposed  # one drafter forward per drafted token


def test_timing_fields_and_zero_cost_limit(run):
    results, _, _ = run
    base = results["target only"]
    rows = method_rows(results, "target only", "HF assisted")
    # Only what holds whatever the clocks read: timers fired, rows carry the right fields, identities hold.
    # How the measured times compare (forwards inside generate < generate, limit > measured rate) is judged on
    # bench runs: each row's timing_problem (test_timing_problem_rule checks that rule on given numbers).
    for name, r in results.items():
        assert r.target_prefill_seconds > 0 and all(t > 0 for t in r.target_step_s)
        row = rows[name]
        assert "timing_problem" in row
        if not r.speculative:
            assert row["decode_step_ms"] > 0 and row["verify_step_ms"] is None and r.drafter_seconds == 0
            assert row["zero_cost_limit_tokens_per_s"] is None
            continue
        assert r.drafter_prefill_seconds > 0 and all(t > 0 for t in r.draft_step_s)
        assert row["verify_step_ms"] > 0 and row["draft_step_ms"] > 0 and row["decode_step_ms"] is None
        # measured speedup = limit speedup x share of the limit
        assert row["zero_cost_limit_speedup_vs_target"] * row["share_of_zero_cost_limit"] == pytest.approx(
            r.tokens_per_s / base.tokens_per_s)
        assert row["expected_speedup_theory"] > 0 and 0 < row["acceptance_iid"] <= 1
        assert row["draft_verify_cost_ratio"] == pytest.approx(r.draft_step_ms / r.target_step_ms)


def test_timing_problem_rule():
    ok = MethodResult("ok", new_tokens=40, seconds=1.0, speculative=True, target_prefill_seconds=0.1,
                      target_step_s=[0.1] * 5, drafter_prefill_seconds=0.05, draft_step_s=[0.02] * 10)
    assert timing_problem(ok) is None
    double = MethodResult("double", new_tokens=40, seconds=1.0, speculative=True, target_step_s=[0.3] * 3,
                          draft_step_s=[0.05] * 4)
    assert "double counts" in timing_problem(double)
    assert timing_problem(MethodResult("target", new_tokens=10, seconds=1.0, target_step_s=[0.5])) is None


def test_method_attrs_apply_during_generate_and_are_restored(run):
    _, drafter, seen = run
    assert set(seen) == {(False, None), (True, "ctx")}
    assert drafter.use_context_tokens == "default" and not hasattr(drafter, "probe")
    with pytest.raises(RuntimeError), applied_attrs(drafter, {"use_context_tokens": True, "probe": 1}):
        raise RuntimeError
    assert drafter.use_context_tokens == "default" and not hasattr(drafter, "probe")


def test_reports_show_timing_columns_and_machine(run):
    results, _, _ = run
    table = format_table(results, baseline="target only")
    assert all(col in table for col in NEW_COLUMNS) and "| target only |" in table
    report = {"machine": machine_info(), "runs": [{"workload": "tiny", "in_domain": True, "mode": "greedy",
                                                   "methods": method_rows(results, "target only", "HF assisted")}]}
    md = format_report(report)
    header = md.splitlines()[0]
    assert header.startswith("Machine: ") and f"torch {torch.__version__}" in header and "torch threads" in header
    assert all(col in md for col in NEW_COLUMNS) and "| trimmed +context |" in md
    assert md.count("| tiny (in-domain) |") == len(results)


def test_bench_cli_context_tokens_flag():
    parser = build_parser()
    assert parser.parse_args(["bench", "--context-tokens"]).context_tokens is True
    assert parser.parse_args(["bench", "--target", "offline:smollm2-135m-instruct"]).context_tokens is False


def test_demo_pair_q_resolves_the_real_pair_and_its_drafter_dtype(monkeypatch):
    from hf_vocabspec import kernels
    from hf_vocabspec.cli import evaluation as cli_eval
    from hf_vocabspec.evaluation import benchmark

    parser = build_parser()
    for native, dtype in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(kernels, "native_bf16", lambda native=native: native)
        args = parser.parse_args(["demo", "--pair", "q"])
        cli_eval.resolve_pair(args)
        assert (args.target, args.drafter, args.drafter_dtype) == (
            "offline:qwen2.5-coder-1.5b-instruct", "offline:qwen2.5-coder-0.5b-instruct", dtype)
    args = parser.parse_args(["demo"])  # pair G stays the default: the target's own bf16 copy drafts
    cli_eval.resolve_pair(args)
    assert (args.target, args.drafter, args.drafter_dtype) == ("offline:gemma-3-270m", None, "bfloat16")
    args = parser.parse_args(["demo", "--pair", "q", "--drafter-dtype", "float32", "--target", "x/y"])
    cli_eval.resolve_pair(args)
    assert (args.target, args.drafter_dtype) == ("x/y", "float32")
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--pair", "z"])
    assert isinstance(benchmark.machine_info()["native_bf16"], bool)


def test_one_generation_config_per_call():
    """generate() gets ONE GenerationConfig (the model's own + overrides), never a config plus loose arguments."""
    target, _ = make_pair("llama", seed=3)
    before = target.generation_config.to_dict()
    cfg = generation_config_for(target, max_new_tokens=7, do_sample=False)
    assert cfg.max_new_tokens == 7 and cfg.do_sample is False and cfg is not target.generation_config
    assert target.generation_config.to_dict() == before  # the model's own config is left alone
    with pytest.raises(ValueError, match="Not generation settings: \\['attention_mask'\\]"):
        generation_config_for(target, attention_mask=None)


def test_bench_command_end_to_end_writes_results_and_plots(cli_model, tmp_path, capsys):
    """Issue #38: `hf-vocabspec bench` crashed on every call (LatencyCurve.plot moved to evaluation.plots). Through
    the real entry point, on the smallest run its options allow: one coverage, one workload, 1 prompt, 4 tokens,
    1 repeat; it exits 0 and writes what the README says: results.json, results.md and the PNG plots."""
    import json

    from hf_vocabspec.cli import main

    model, chats = cli_model
    out = tmp_path / "bench"
    rc = main(["bench", "--target", str(model), "--drafter-dtype", "float32", "--dataset", str(chats),
               "--count-examples", "24", "--coverages", "0.9", "--workloads", str(chats), "--prompts", "1",
               "--max-new-tokens", "4", "--repeats", "1", "--num-draft-tokens", "2", "--output", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert {"results.json", "results.md", "throughput_vs_vocab.png", "draft_latency_vs_vocab.png"} <= {
        p.name for p in out.iterdir()}
    for png in ("throughput_vs_vocab.png", "draft_latency_vs_vocab.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((out / "results.json").read_text())
    assert len(report["runs"]) == 1 and report["runs"][0]["prompts"] == 1
    assert any(name.startswith("trimmed k=") for name in report["runs"][0]["methods"])
    assert "target only" in (out / "results.md").read_text()


def test_kernel_choices_for_every_verify_width_are_made_in_the_warm_up():
    """A timed call must not pay kernel trials: the warm-up settles the target's choices for 1..16 rows (a
    target-only call alone only ever sees the prompt's rows and 1)."""
    from torch import nn

    from hf_vocabspec import kernels

    if not kernels.available():
        pytest.skip("this torch build has no oneDNN")
    target, _ = make_pair("gemma3", seed=3)
    kernels.forget_choices()
    try:
        compare_methods(target, [Method("target only (fast linears)", fast_linears=True)], PROMPTS[:1],
                        max_new_tokens=3, generate_kwargs={"do_sample": False})
        decided = {(c.key.out_features, c.key.in_features, c.key.rows) for c in kernels.choices()
                   if c.chosen is not None}
    finally:
        kernels.forget_choices()
    shapes = {(m.out_features, m.in_features) for m in target.modules() if type(m) is nn.Linear}
    assert decided >= {(*shape, rows) for shape in shapes for rows in range(1, kernels.EXACT_ROWS + 1)}


def test_the_drafter_s_kernel_choices_are_made_in_the_warm_up_too():
    """The drafter's steps must not pay trials in a timed call either: the warm-up settles its choices (int8 copies
    among the candidates up to QUANTIZED_MAX_ROWS rows, as a generate call makes them); without its settle, a
    3-token warm-up call leaves most of them undecided."""
    from torch import nn

    from hf_vocabspec import kernels, trim_drafter
    from hf_vocabspec.modeling import QUANTIZED_MAX_ROWS, quantization_ops_available

    if not kernels.available() or not quantization_ops_available("int8"):
        pytest.skip("this torch build has no oneDNN or no int8 kernel")
    target, base = make_pair("llama", seed=3)
    drafter = trim_drafter(base, list(range(3, 40)))
    kernels.forget_choices()
    try:
        compare_methods(target, [Method("trimmed", drafter)], PROMPTS[:1], max_new_tokens=3,
                        generate_kwargs={"do_sample": False})
        decided = {(c.key.out_features, c.key.in_features, c.key.rows) for c in kernels.choices()
                   if c.chosen is not None and c.key.draft and c.key.dtype == "float32"}
    finally:
        kernels.forget_choices()
    shapes = {(m.out_features, m.in_features) for m in drafter.modules() if type(m) is nn.Linear}
    assert decided >= {(*shape, rows) for shape in shapes for rows in range(1, QUANTIZED_MAX_ROWS + 1)}
