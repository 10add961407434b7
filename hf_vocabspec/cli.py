"""``hf-vocabspec``: count assistant-token coverage, trim a drafter, and the end-to-end demo."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _log(msg: str) -> None:
    print(f"[hf-vocabspec] {msg}", file=sys.stderr, flush=True)


def _count(args) -> "object":
    """Count on this process, or sharded over all processes under `accelerate launch` (identical result)."""
    from .coverage import count_assistant_tokens_distributed
    from .offline import load_chat_dataset, load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    dataset = load_chat_dataset(args.dataset)
    return count_assistant_tokens_distributed(dataset, tokenizer, max_examples=args.max_examples, progress=True)


def _is_main_process() -> bool:
    from accelerate import PartialState

    return PartialState(cpu=True).is_main_process


def cmd_count(args) -> int:
    counts = _count(args)
    if not _is_main_process():
        return 0
    counts.save(args.output)
    from accelerate import PartialState

    _log(f"counted on {PartialState(cpu=True).num_processes} process(es)")
    _log(f"counted {counts.num_tokens:,} assistant tokens in {counts.num_assistant_turns:,} turns -> {args.output}")
    for c in (0.9, 0.95, 0.99):
        _log(f"  coverage {c:.0%}: top-{counts.smallest_k_for_coverage(c):,} tokens")
    return 0


def _select(args, counts, model, out_dir: Path):
    """Run the vocabulary search; write selection.json, pareto.png (and latency.png when measured)."""
    from .cost import measure_draft_latency
    from .selection import select_vocabulary

    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = counts.vocab_size
    curve = None
    if args.cost == "measured":
        ks = sorted({k for k in (1024, 4096, 16384, 65536) if k < vocab} | {vocab})
        _log(f"measuring the draft step at k in {ks} (+ body-only floor)")
        curve = measure_draft_latency(model, ks)
        curve.plot(out_dir / "latency.png")
        cost = curve
    else:
        cost = model.config
    result = select_vocabulary(
        counts, cost, min_coverage=args.min_coverage, objective=args.objective, n_trials=args.n_trials,
        seed=args.seed, k_range=(50, min(args.max_k, vocab)), storage=args.storage,
    )
    result.plot_pareto(out_dir / "pareto.png")
    info = result.to_dict() | {"counts_tokenizer": counts.tokenizer_name, "latency_curve": curve.to_dict() if curve else None}
    (out_dir / "selection.json").write_text(json.dumps(info, indent=2))
    return result, curve


def cmd_select(args) -> int:
    from .coverage import TokenCounts
    from .offline import load_model

    counts = TokenCounts.load(args.counts)
    model = load_model(args.drafter, dtype=DTYPES[args.dtype]).eval()
    result, _ = _select(args, counts, model, Path(args.output))
    _log(f"k={result.k:,} coverage={result.coverage:.2%} objective={result.objective}={result.value:.3f} "
         f"predicted draft-step speedup {result.predicted_draft_speedup:.2f}x ({result.cost_source}) -> {args.output}")
    return 0


def cmd_trim(args) -> int:
    """count (or --counts) -> select -> trim -> save (-> push); prints a summary."""
    if (args.bench_results or args.private or args.license) and not args.push_to_hub:
        raise SystemExit("--bench-results / --private / --license only apply with --push-to-hub REPO_ID.")
    if args.bench_results and not Path(args.bench_results).is_file():
        raise SystemExit(f"--bench-results: no such file {args.bench_results!r} (the results.json of `hf-vocabspec bench`).")
    from .coverage import TokenCounts
    from .cost import measure_draft_latency
    from .drafter import trim_drafter
    from .offline import load_model, load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer or args.drafter)
    if args.counts:
        counts = TokenCounts.load(args.counts)
    else:
        args.tokenizer = args.tokenizer or args.drafter
        counts = _count(args)
        if not _is_main_process():
            return 0
    out = Path(args.output)
    model = load_model(args.drafter, dtype=DTYPES[args.dtype]).eval()
    if args.k:
        k, result, curve = args.k, None, None
    else:
        result, curve = _select(args, counts, model, out / "selection")
        k = result.k
    keep = counts.top_k(k)
    selection = {"method": "top-k by assistant-token count", "k": k, "coverage": counts.coverage(k),
                 "min_coverage": args.min_coverage, "dataset": getattr(args, "dataset", None),
                 "objective": result.objective if result else "fixed k", "cost_source": result.cost_source if result else None}
    drafter = trim_drafter(model, keep, tokenizer=tokenizer, target_model=args.target, selection=selection)
    drafter.save_pretrained(out)
    tokenizer.save_pretrained(out)
    k_kept = drafter.config.draft_vocab_size
    measured = measure_draft_latency(load_model(args.drafter, dtype=DTYPES[args.dtype]).eval(), [k_kept, counts.vocab_size])
    speedup = measured.seconds[1] / measured.seconds[0]
    print(f"kept {k_kept:,} of {drafter.config.vocab_size:,} tokens; coverage {counts.coverage(k):.2%} of counted "
          f"assistant tokens")
    if result:
        print(f"predicted draft-step speedup {result.predicted_draft_speedup:.2f}x ({result.cost_source}); "
              f"Pareto plot: {out / 'selection' / 'pareto.png'}")
    print(f"measured draft-step: {measured.seconds[1] * 1e3:.1f} ms full head -> {measured.seconds[0] * 1e3:.1f} ms "
          f"trimmed ({speedup:.2f}x; body-only floor {measured.floor_seconds * 1e3:.1f} ms)")
    print(f"saved to {out}")
    from .hub import write_custom_generate

    if not args.no_custom_generate:  # target.generate(custom_generate=<out>, trust_remote_code=True)
        write_custom_generate(out, str(out.resolve()))
    if args.push_to_hub:
        from .hub import push_drafter_to_hub

        workload = f"{args.dataset} (counted assistant turns)" if not args.counts else f"{args.counts} (counts file)"
        measured_rows = [
            {"metric_type": "coverage", "metric_name": "assistant-token coverage of the kept vocabulary",
             "metric_value": round(counts.coverage(k), 6), "dataset_name": workload},
            {"metric_type": "draft_step_speedup", "metric_name": f"draft-step speedup vs full head ({args.dtype}, measured)",
             "metric_value": round(speedup, 4), "dataset_name": workload},
        ]
        sel_dir = out / "selection"
        extra = {f"selection/{name}": sel_dir / name for name in ("selection.json", "pareto.png", "latency.png")
                 if result is not None and (sel_dir / name).is_file()}
        url = push_drafter_to_hub(
            drafter, args.push_to_hub, tokenizer=tokenizer, eval_results=measured_rows, license=args.license,
            private=args.private, custom_generate=not args.no_custom_generate, benchmark=args.bench_results,
            pareto=None if result is None else result.to_dict()["pareto"] + [
                {"k": result.k, "coverage": result.coverage, "relative_cost": result.relative_draft_cost, "chosen": True}],
            extra_files=extra,
        )
        print(f"pushed to {url}")
    return 0


def cmd_demo(args) -> int:
    from tqdm.auto import tqdm

    from .benchmark import Method, compare_methods, eval_prompts, format_table
    from .drafter import TrimmedDrafter, trim_drafter
    from .offline import load_chat_dataset, load_model, load_tokenizer

    torch.set_num_threads(args.threads or torch.get_num_threads())
    out_dir = Path(args.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()

    _log(f"1/5 counting assistant tokens of {args.dataset} with the tokenizer of {args.target}")
    tokenizer = load_tokenizer(args.target)
    dataset = load_chat_dataset(args.dataset)
    from .coverage import count_assistant_tokens

    counts = count_assistant_tokens(dataset, tokenizer, max_examples=args.count_examples, progress=True)
    counts.save(out_dir / "counts.safetensors")
    keep = counts.top_k(counts.smallest_k_for_coverage(args.min_coverage))
    k = int(keep.numel())
    _log(f"    {counts.num_tokens:,} tokens; top-{k:,} of {len(tokenizer):,} cover {counts.coverage(k):.2%}")

    _log(f"2/5 loading target (fp32) and drafter ({args.drafter_dtype} copy of the target)")
    target = load_model(args.target, dtype=torch.float32).eval()
    drafter_full = load_model(args.drafter or args.target, dtype=DTYPES[args.drafter_dtype]).eval()
    for m in (drafter_full,):
        m.generation_config.num_assistant_tokens = args.num_assistant_tokens
        m.generation_config.num_assistant_tokens_schedule = "constant"
        m.generation_config.assistant_confidence_threshold = 0.0

    _log("3/5 trimming, saving and reloading the drafter")
    trimmed = trim_drafter(
        load_model(args.drafter or args.target, dtype=DTYPES[args.drafter_dtype]), keep, tokenizer=tokenizer,
        target_model=args.target,
        selection={"min_coverage": args.min_coverage, "k": k, "coverage": counts.coverage(k),
                   "dataset": args.dataset, "count_examples": args.count_examples},
    )
    trimmed.generation_config.num_assistant_tokens = args.num_assistant_tokens
    trimmed.save_pretrained(out_dir / "drafter")
    tokenizer.save_pretrained(out_dir / "drafter")
    del trimmed
    from transformers import AutoModelForCausalLM

    trimmed = AutoModelForCausalLM.from_pretrained(out_dir / "drafter", dtype=DTYPES[args.drafter_dtype]).eval()
    assert isinstance(trimmed, TrimmedDrafter)

    _log(f"4/5 generating {args.prompts} held-out prompts x {args.max_new_tokens} tokens, greedy, "
         f"{args.repeats} repeat(s), methods interleaved")
    prompts = eval_prompts(dataset, tokenizer, start=max(args.count_examples or 0, len(dataset) - 2000),
                            n=args.prompts, max_prompt_tokens=args.max_prompt_tokens,
                            answer_prefix_tokens=args.answer_prefix_tokens)
    methods = [
        Method("target only", None),
        Method(f"HF assisted, untrimmed {args.drafter_dtype} drafter", drafter_full),
        Method(f"hf_vocabspec trimmed drafter (k={k:,})", trimmed),
    ]
    results = compare_methods(
        target, methods, prompts, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
        generate_kwargs={"do_sample": False}, progress=lambda s: tqdm(s, desc="generate"),
    )
    names = [m.name for m in methods]
    identical = results[names[2]].outputs == results[names[0]].outputs
    table = format_table(results, baseline=names[0])

    _log("5/5 results")
    summary = {
        "target": args.target, "dataset": args.dataset, "kept_vocab": k, "full_vocab": len(tokenizer),
        "coverage_on_counted_text": counts.coverage(k), "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens, "greedy_output_identical_to_target": identical,
        "methods": {n: r.to_dict() for n, r in results.items()},
        "torch_threads": torch.get_num_threads(), "seconds_total": time.perf_counter() - t_start,
        "date": time.strftime("%Y-%m-%d"), "cpu": os.uname().machine,
    }
    (out_dir / "results.json").write_text(json.dumps(summary, indent=2))
    (out_dir / "results.md").write_text(table + "\n")
    print(table)
    from .benchmark import _median_ratio

    def ratio(a, b):
        r = _median_ratio(results[a], results[b])
        return f"{r['median']:.2f}x (per-repeat range {r['min']:.2f}-{r['max']:.2f})"

    summary["trimmed_vs_hf_assisted"] = _median_ratio(results[names[2]], results[names[1]])
    summary["trimmed_vs_target_only"] = _median_ratio(results[names[2]], results[names[0]])
    (out_dir / "results.json").write_text(json.dumps(summary, indent=2))
    print(f"\ntrimmed vs HF assisted with the same untrimmed drafter: {ratio(names[2], names[1])}; "
          f"vs target only: {ratio(names[2], names[0])}")
    print(f"greedy output identical to target-only: {'yes' if identical else 'NO'}")
    print(f"kept {k:,} of {len(tokenizer):,} tokens ({counts.coverage(k):.2%} of counted assistant tokens); "
          f"drafter saved to {out_dir / 'drafter'}")
    return 0 if identical or not args.strict else 1


def cmd_bench(args) -> int:
    from tqdm.auto import tqdm

    from .benchmark import BenchConfig, run_benchmark

    cfg = BenchConfig(
        target=args.target, drafter=args.drafter, drafter_dtype=args.drafter_dtype, vocab_dataset=args.dataset,
        count_examples=args.count_examples, coverages=tuple(args.coverages), ks=tuple(args.ks), workloads=tuple(args.workloads),
        modes=tuple(args.modes), prompts=args.prompts, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
        num_assistant_tokens=args.num_assistant_tokens, context_tokens=args.context_tokens,
    )
    report = run_benchmark(cfg, args.output, progress=lambda s: tqdm(s, desc="generate"))
    from .benchmark import format_report

    print(format_report(report))
    _log(f"results: {args.output}/results.json, results.md, throughput_vs_vocab.png")
    return 0


def _selection_args(p) -> None:
    p.add_argument("--min-coverage", type=float, default=0.95)
    p.add_argument("--objective", choices=["throughput", "utility"], default="throughput")
    p.add_argument("--cost", choices=["measured", "flops"], default="measured",
                   help="draft cost model: measured step latency on this device, or architecture-aware FLOPs")
    p.add_argument("--n-trials", type=int, default=100)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--max-k", type=int, default=65536)
    p.add_argument("--storage", default=None, help="journal file (or sqlite:///...) to resume/share the study")


def cmd_rdk_fit(args) -> int:
    """Fit (or build the prior) RDK kernel for a saved trimmed drafter and save it into the checkpoint."""
    from .coverage import count_assistant_tokens
    from .drafter import TrimmedDrafter
    from .offline import load_chat_dataset, load_model, load_tokenizer
    from .rdk import calibration_sequences, collect_calibration, embedding_prior_kernel, fit_rdk_kernel

    drafter = TrimmedDrafter.from_pretrained(args.drafter)
    target_name = args.target or drafter.config.target_model
    if not target_name:
        raise SystemExit("The drafter does not record its target: pass --target (the model whose distributions to fit).")
    tokenizer = load_tokenizer(target_name)
    dataset = load_chat_dataset(args.dataset)
    if args.method == "fitted":
        _log(f"calibrating on {args.sequences} assistant turns of {args.dataset} with {target_name} (T={args.temperature})")
        target = load_model(target_name, dtype=torch.float32).eval()
        seqs = calibration_sequences(dataset, tokenizer, max_sequences=args.sequences, skip=args.skip)
        calib = collect_calibration(target, seqs, temperature=args.temperature)
        kernel = fit_rdk_kernel(calib, drafter.d2t.cpu(), num_targets=args.num_targets)
    else:
        counts = count_assistant_tokens(dataset, tokenizer, max_examples=args.max_examples, progress=True)
        kernel = embedding_prior_kernel(drafter.get_input_embeddings().weight, drafter.d2t.cpu(),
                                        pruned_mass=max(0.0, 1 - counts.coverage_of(drafter.d2t.cpu())),
                                        num_targets=args.num_targets, candidate_ids=(counts.counts > 0).nonzero()[:, 0])
    drafter.set_rdk_kernel(kernel)
    out = args.output or args.drafter
    drafter.save_pretrained(out)
    held = kernel.info.get("holdout_acceptance_by_shrink", {})
    print(json.dumps({"kernel": kernel.method, "moved_mass": kernel.moved_mass, "num_targets": kernel.num_targets,
                      "holdout_expected_acceptance_by_shrink": held, "saved_to": str(out)}, indent=2))
    return 0


def cmd_acceptance(args) -> int:
    from tqdm.auto import tqdm

    from .acceptance import run_acceptance_report

    report = run_acceptance_report(args.target, args.output, dataset=args.dataset, count_examples=args.count_examples,
                                   levels=args.levels, conversations=args.conversations,
                                   temperatures=args.temperatures, num_draft_tokens=args.num_assistant_tokens,
                                   progress=lambda s: tqdm(s, desc="score"))
    from .acceptance import format_acceptance

    print(f"{report['positions']} held-out answer positions, {report['conversations']} conversations")
    print(format_acceptance(report))
    print(f"wrote {args.output}/results.json, results.md, acceptance_vs_vocab.png")
    return 0


def cmd_rdk_bench(args) -> int:
    from tqdm.auto import tqdm

    from .rdk_benchmark import RDKBenchConfig, run_rdk_benchmark

    cfg = RDKBenchConfig(
        target=args.target, drafter_dtype=args.drafter_dtype, dataset=args.dataset,
        count_examples=args.count_examples, levels=tuple(args.levels), temperatures=tuple(args.temperatures),
        calibration_sequences=args.calibration_sequences, score_sequences=args.score_sequences,
        num_targets=args.num_targets, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
        repeats=args.repeats, generate=not args.no_generate,
    )
    report = run_rdk_benchmark(cfg, args.output, progress=lambda s: tqdm(s, desc="rdk-bench"))
    print((Path(args.output) / "results.md").read_text())
    print(f"done in {report['seconds_total']:.0f} s; results in {args.output}")
    return 0


def cmd_distill(args) -> int:
    """Distil a small same-tokenizer drafter from the target (resumes from --output if it holds a run)."""
    from .distill import DistillConfig, distill

    if args.output is None:
        name = str(args.target).removeprefix("offline:").rstrip("/").split("/")[-1]
        args.output = f"results/distilled/{name}-{args.num_layers}l"
    cfg = DistillConfig(
        target=args.target, num_layers=args.num_layers, dataset=args.dataset, output_dir=args.output,
        seq_len=args.seq_len, batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup_steps,
        max_steps=args.max_steps, time_budget_s=args.time_budget, seed=args.seed, save_every=args.save_every,
        eval_sequences=args.eval_sequences, target_dtype=args.target_dtype, autocast=not args.no_autocast,
        freeze_embeddings=not args.train_embeddings, overwrite=args.overwrite,
    )
    if cfg.max_steps is None and cfg.time_budget_s is None:
        cfg.max_steps = 1000
    summary = distill(cfg, progress=True)
    print(json.dumps(summary, indent=2))
    _log(f"student saved to {args.output} (stopped: {summary['stopped']}); report: {args.output}/distill_report.json")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hf-vocabspec", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("count", help="count assistant-token frequencies of a chat dataset")
    c.add_argument("--tokenizer", default="offline:smollm2-135m-instruct", help="target model/tokenizer id")
    c.add_argument("--dataset", default="offline:sharegpt")
    c.add_argument("--max-examples", type=int, default=None)
    c.add_argument("--output", default="counts.safetensors")
    c.set_defaults(func=cmd_count)

    t = sub.add_parser("trim", help="trim a drafter's LM head to the tokens that cover the workload")
    t.add_argument("--drafter", default="offline:smollm2-135m-instruct")
    t.add_argument("--target", default=None, help="the target model id this drafter serves (recorded)")
    t.add_argument("--tokenizer", default=None, help="defaults to the drafter's")
    t.add_argument("--counts", default=None, help="counts file from `hf-vocabspec count` (else count now)")
    t.add_argument("--dataset", default="offline:sharegpt")
    t.add_argument("--max-examples", type=int, default=5000)
    _selection_args(t)
    t.add_argument("--k", type=int, default=None, help="keep exactly the top-k tokens (skips the search)")
    t.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    t.add_argument("--push-to-hub", default=None, metavar="REPO_ID",
                   help="also push the drafter with a model card (HF_TOKEN / `hf auth login`; HF_ENDPOINT honoured)")
    t.add_argument("--private", action="store_true", help="with --push-to-hub: create the repo private")
    t.add_argument("--license", default=None, help="card licence (default: inherited from the base drafter/target)")
    t.add_argument("--bench-results", default=None, metavar="RESULTS_JSON",
                   help="with --push-to-hub: add this kept size's rows of an `hf-vocabspec bench` results.json to the card")
    t.add_argument("--no-custom-generate", action="store_true",
                   help="do not write/push the custom_generate/ recipe (target.generate(custom_generate=repo))")
    t.add_argument("--output", default="trimmed-drafter")
    t.set_defaults(func=cmd_trim)

    se = sub.add_parser("select", help="choose the kept vocabulary size: TPE under a coverage constraint")
    se.add_argument("--counts", required=True, help="counts file from `hf-vocabspec count`")
    se.add_argument("--drafter", default="offline:smollm2-135m-instruct", help="drafter whose step cost is modelled")
    se.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    _selection_args(se)
    se.add_argument("--output", default="selection")
    se.set_defaults(func=cmd_select)

    d = sub.add_parser("demo", help="count -> trim -> save -> reload -> generate, vs target-only and HF assisted")
    d.add_argument("--target", default="offline:gemma-3-270m")
    d.add_argument("--drafter", default=None, help="default: a reduced-precision copy of the target")
    d.add_argument("--drafter-dtype", choices=sorted(DTYPES), default="bfloat16")
    d.add_argument("--dataset", default="offline:sharegpt")
    d.add_argument("--count-examples", type=int, default=4000)
    d.add_argument("--min-coverage", type=float, default=0.99)
    d.add_argument("--prompts", type=int, default=4)
    d.add_argument("--max-new-tokens", type=int, default=64)
    d.add_argument("--max-prompt-tokens", type=int, default=256)
    d.add_argument("--answer-prefix-tokens", type=int, default=32,
                   help="prompts carry this many tokens of the reference answer (0: bare chat prompts)")
    d.add_argument("--num-assistant-tokens", type=int, default=5)
    d.add_argument("--repeats", type=int, default=1)
    d.add_argument("--threads", type=int, default=None)
    d.add_argument("--strict", action="store_true", help="exit 1 if greedy output differs from target-only")
    d.add_argument("--output", default="results/demo")
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", help="side-by-side benchmark: methods x vocabulary sizes x workloads x modes")
    b.add_argument("--target", default="offline:gemma-3-270m")
    b.add_argument("--drafter", default=None)
    b.add_argument("--drafter-dtype", choices=sorted(DTYPES), default="bfloat16")
    b.add_argument("--dataset", default="offline:sharegpt", help="domain the vocabulary is chosen on")
    b.add_argument("--count-examples", type=int, default=4000)
    b.add_argument("--coverages", type=float, nargs="*", default=[0.9, 0.95, 0.99])
    b.add_argument("--ks", type=int, nargs="*", default=[], help="explicit kept sizes, e.g. a selected k and neighbours")
    b.add_argument("--workloads", nargs="+", default=["offline:sharegpt", "offline:humaneval"])
    b.add_argument("--modes", nargs="+", choices=["greedy", "t0.7", "t1"], default=["greedy"])
    b.add_argument("--prompts", type=int, default=3)
    b.add_argument("--max-new-tokens", type=int, default=48)
    b.add_argument("--repeats", type=int, default=2)
    b.add_argument("--num-assistant-tokens", type=int, default=5)
    b.add_argument("--context-tokens", action="store_true",
                   help="also run every trimmed k with context tokens on (same drafter, method 'trimmed k=K +context')")
    b.add_argument("--output", default="results/bench")
    b.set_defaults(func=cmd_bench)

    rf = sub.add_parser("rdk-fit", help="fit an RDK kernel (out-of-vocabulary sampling) into a saved trimmed drafter")
    rf.add_argument("drafter", help="directory or repo of a trimmed drafter")
    rf.add_argument("--target", default=None, help="default: the target recorded in the drafter")
    rf.add_argument("--dataset", default="offline:sharegpt")
    rf.add_argument("--method", choices=["fitted", "prior"], default="fitted")
    rf.add_argument("--sequences", type=int, default=150, help="calibration assistant turns (fitted)")
    rf.add_argument("--skip", type=int, default=0, help="skip this many assistant turns (e.g. those counted)")
    rf.add_argument("--max-examples", type=int, default=4000, help="conversations counted (prior)")
    rf.add_argument("--temperature", type=float, default=1.0)
    rf.add_argument("--num-targets", type=int, default=8)
    rf.add_argument("--output", default=None, help="default: overwrite the drafter directory")
    rf.set_defaults(func=cmd_rdk_fit)

    rb = sub.add_parser("rdk-bench", help="RDK evidence: acceptance and tau vs kept vocabulary, vanilla vs RDK")
    rb.add_argument("--target", default="offline:gemma-3-270m")
    rb.add_argument("--drafter-dtype", choices=sorted(DTYPES), default="bfloat16")
    rb.add_argument("--dataset", default="offline:sharegpt")
    rb.add_argument("--count-examples", type=int, default=4000)
    rb.add_argument("--levels", type=float, nargs="+", default=[0.5, 0.75, 0.9, 0.95, 0.97])
    rb.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7])
    rb.add_argument("--calibration-sequences", type=int, default=150)
    rb.add_argument("--score-sequences", type=int, default=12)
    rb.add_argument("--num-targets", type=int, default=8)
    rb.add_argument("--prompts", type=int, default=3)
    rb.add_argument("--max-new-tokens", type=int, default=48)
    rb.add_argument("--repeats", type=int, default=1)
    rb.add_argument("--no-generate", action="store_true", help="only fit and score kernels (no generation)")
    rb.add_argument("--output", default="results/rdk")
    rb.set_defaults(func=cmd_rdk_bench)

    ac = sub.add_parser("acceptance", help="exact expected acceptance vs kept vocabulary: vanilla vs context tokens")
    ac.add_argument("--target", default="offline:gemma-3-270m")
    ac.add_argument("--dataset", default="offline:sharegpt")
    ac.add_argument("--count-examples", type=int, default=4000)
    ac.add_argument("--levels", type=float, nargs="+", default=[0.5, 0.75, 0.9, 0.95, 0.97], help="pruned shares")
    ac.add_argument("--conversations", type=int, default=24, help="held-out conversations scored")
    ac.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7])
    ac.add_argument("--num-assistant-tokens", type=int, default=5)
    ac.add_argument("--output", default="results/acceptance")
    ac.set_defaults(func=cmd_acceptance)
    ds = sub.add_parser("distill", help="distil a small same-tokenizer drafter: the target's first layers, trained by KL")
    ds.add_argument("--target", default="offline:smollm2-135m-instruct")
    ds.add_argument("--num-layers", type=int, default=4, help="student depth (the target's first N layers)")
    ds.add_argument("--dataset", default="offline:sharegpt", help="chat dataset; trains on assistant positions")
    ds.add_argument("--max-steps", type=int, default=None, help="default 1000 when --time-budget is not given")
    ds.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                    help="stop cleanly (eval + save included) within this wall-clock time")
    ds.add_argument("--seq-len", type=int, default=256)
    ds.add_argument("--batch-size", type=int, default=8)
    ds.add_argument("--lr", type=float, default=3e-4)
    ds.add_argument("--warmup-steps", type=int, default=10)
    ds.add_argument("--save-every", type=int, default=50)
    ds.add_argument("--eval-sequences", type=int, default=16, help="held-out sequences for top-1 agreement")
    ds.add_argument("--seed", type=int, default=0)
    ds.add_argument("--target-dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="dtype of the target that gives training distributions (agreement is scored vs fp32)")
    ds.add_argument("--no-autocast", action="store_true", help="train the student without bf16 autocast")
    ds.add_argument("--train-embeddings", action="store_true", help="also train the (tied) embeddings / LM head")
    ds.add_argument("--overwrite", action="store_true", help="start afresh instead of resuming from --output")
    ds.add_argument("--output", default=None, help="default: results/distilled/<target>-<N>l")
    ds.set_defaults(func=cmd_distill)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
