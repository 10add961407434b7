"""The evaluation commands: demo, bench, acceptance, rdk-bench, distill (tooling in hf_vocabspec.evaluation)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ._common import (
    AUTO_DTYPE_HELP,
    DTYPES,
    WEIGHT_QUANTIZATION_CHOICES,
    UsageError,
    check_dataset_name,
    check_model_name,
    check_tokenizer_of,
    check_ks_in_vocabulary,
    confidence_threshold,
    coverage_fraction,
    given,
    log,
    non_negative_int,
    output_folder,
    overwrite_arg,
    positive_float,
    positive_int,
    prepare_output,
    pruned_share,
    weight_scheme,
)


def draft_policy(args) -> tuple[int, float]:
    """(L, confidence stop) of every drafting method of demo/bench: the options, else a freshly trimmed drafter's."""
    from ..configuration import DEFAULT_CONFIDENCE_THRESHOLD, DEFAULT_NUM_ASSISTANT_TOKENS

    threshold = getattr(args, "confidence_threshold", None)
    return (args.num_draft_tokens or DEFAULT_NUM_ASSISTANT_TOKENS,
            DEFAULT_CONFIDENCE_THRESHOLD if threshold is None else threshold)


def draft_policy_args(parser) -> None:
    """--num-draft-tokens and --confidence-threshold: the draft policy of every drafting method (draft_policy)."""
    parser.add_argument("--num-draft-tokens", "--num-assistant-tokens", type=positive_int, default=None,
                        dest="num_draft_tokens", help="draft length L of every drafting method (default: a freshly "
                                                      "trimmed drafter's own)")
    parser.add_argument("--confidence-threshold", type=confidence_threshold, default=None,
                        help="stop a round's drafting after a draft the drafter gives less than this (0: never; "
                             "default: a freshly trimmed drafter's own)")


def check_drafter_tokenizer(args) -> None:
    """--target/--drafter must exist and share a tokenizer: checked on the tokenizers, before any model is loaded."""
    check_model_name(args.target, "--target")
    check_model_name(getattr(args, "drafter", None), "--drafter")
    if getattr(args, "drafter", None):
        from ..evaluation.offline import load_tokenizer

        check_tokenizer_of(args.drafter, load_tokenizer(args.target), option="--drafter",
                             other=f"the target {args.target}")


# Demo pairs: G (default, fast) = Gemma-3-270M with its own bf16 copy as drafter; Q = the real Qwen2.5-Coder
# 0.5B drafter for the 1.5B target (`make setup-pair` installs it; untied heads, so context tokens use kept rows).
DEMO_PAIRS = {
    "g": {"target": "offline:gemma-3-270m", "drafter": None},
    "q": {"target": "offline:qwen2.5-coder-1.5b-instruct", "drafter": "offline:qwen2.5-coder-0.5b-instruct"},
}


def resolve_pair(args) -> None:
    """Fill --target / --drafter / --drafter-dtype from --pair where not given (drafter dtype: bf16 where the
    CPU has native bf16, else fp32; a given --drafter-dtype wins)."""
    from ..kernels import native_bf16

    pair = DEMO_PAIRS[args.pair]
    if args.target is None:
        args.target = pair["target"]
    if args.drafter is None:
        args.drafter = pair["drafter"]
    if args.drafter_dtype is None:
        args.drafter_dtype = "bfloat16" if args.pair == "g" or native_bf16() else "float32"


def cmd_demo(args) -> int:
    import torch

    resolve_pair(args)
    out_dir = prepare_output(args.output, "demo", overwrite=args.overwrite, parent_must_exist=False)
    check_dataset_name(args.dataset)
    check_drafter_tokenizer(args)
    torch.set_num_threads(args.threads or torch.get_num_threads())
    with output_folder(out_dir):
        return _demo(args, out_dir)


def _demo(args, out_dir: Path) -> int:
    import torch
    from tqdm.auto import tqdm

    from ..configuration import set_draft_length
    from ..evaluation.benchmark import Method, compare_methods, format_table
    from ..evaluation.data import count_split, eval_prompts
    from ..evaluation.offline import load_chat_dataset, load_model, load_tokenizer
    from ..modeling import TrimmedDrafter
    from ..trimming import trim_drafter

    t_start = time.perf_counter()

    log(f"1/5 counting assistant tokens of {args.dataset} with the tokenizer of {args.target}")
    tokenizer = load_tokenizer(args.target)
    dataset = load_chat_dataset(args.dataset)
    from ..coverage import count_assistant_tokens

    counted, held_out = count_split(dataset, args.count_examples or len(dataset))
    counts = count_assistant_tokens(counted, tokenizer, progress=True)
    counts.save(out_dir / "counts.safetensors")
    keep = counts.top_k(counts.smallest_k_for_coverage(args.min_coverage))
    k = int(keep.numel())
    log(f"    {counts.num_tokens:,} tokens; top-{k:,} of {len(tokenizer):,} cover {counts.coverage(k):.2%}")

    what = f"{args.drafter}, {args.drafter_dtype}" if args.drafter else f"{args.drafter_dtype} copy of the target"
    log(f"2/5 loading target (fp32) and drafter ({what})")
    target = load_model(args.target, dtype=torch.float32).eval()
    drafter_full = load_model(args.drafter or args.target, dtype=DTYPES[args.drafter_dtype]).eval()
    set_draft_length(drafter_full.generation_config, *draft_policy(args))

    log("3/5 trimming, saving and reloading the drafter")
    trimmed = trim_drafter(
        load_model(args.drafter or args.target, dtype=DTYPES[args.drafter_dtype]), keep, tokenizer=tokenizer,
        target_model=args.target,
        selection={"min_coverage": args.min_coverage, "k": k, "coverage": counts.coverage(k),
                   "dataset": args.dataset, "count_examples": args.count_examples},
    )
    set_draft_length(trimmed.generation_config, *draft_policy(args))
    trimmed.save_pretrained(out_dir / "drafter")
    tokenizer.save_pretrained(out_dir / "drafter")
    del trimmed
    from transformers import AutoModelForCausalLM

    trimmed = AutoModelForCausalLM.from_pretrained(out_dir / "drafter", dtype=DTYPES[args.drafter_dtype]).eval()
    assert isinstance(trimmed, TrimmedDrafter)

    log(f"4/5 generating {args.prompts} held-out prompts x {args.max_new_tokens} tokens, greedy, "
         f"{args.repeats} repeat(s), methods interleaved")
    # the last 2,000 held-out conversations (the same prompts since the demo's first release)
    prompts = eval_prompts(held_out, tokenizer, start=max(0, len(held_out) - 2000),
                            n=args.prompts, max_prompt_tokens=args.max_prompt_tokens,
                            answer_prefix_tokens=args.answer_prefix_tokens)
    methods = [
        Method("target only", None),
        Method(f"HF assisted, untrimmed {args.drafter_dtype} drafter", drafter_full),
        Method(f"hf_vocabspec trimmed drafter (k={k:,}{', +context' if trimmed.use_context_tokens else ''})", trimmed),
    ]
    results = compare_methods(
        target, methods, prompts, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
        generate_kwargs={"do_sample": False}, progress=lambda s: tqdm(s, desc="generate"),
    )
    names = [m.name for m in methods]
    identical = results[names[2]].outputs == results[names[0]].outputs
    table = format_table(results, baseline=names[0])

    log("5/5 results")
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
    from ..evaluation.benchmark import median_ratio

    def ratio(a, b):
        r = median_ratio(results[a], results[b])
        return f"{r['median']:.2f}x (per-repeat range {r['min']:.2f}-{r['max']:.2f})"

    summary["trimmed_vs_hf_assisted"] = median_ratio(results[names[2]], results[names[1]])
    summary["trimmed_vs_target_only"] = median_ratio(results[names[2]], results[names[0]])
    (out_dir / "results.json").write_text(json.dumps(summary, indent=2))
    print(f"\ntrimmed vs HF assisted with the same untrimmed drafter: {ratio(names[2], names[1])}; "
          f"vs target only: {ratio(names[2], names[0])}")
    print(f"greedy output identical to target-only: {'yes' if identical else 'NO'}")
    print(f"kept {k:,} of {len(tokenizer):,} tokens ({counts.coverage(k):.2%} of counted assistant tokens); "
          f"drafter saved to {out_dir / 'drafter'}")
    return 0 if identical or not args.strict else 1


# bench options the batched bench (--batch-sizes) does not read, and the one only it reads
_PLAIN_BENCH_ONLY = ("ks", "workloads", "modes", "prompts", "context_tokens", "kernel_levers", "ssd", "ssd_mode")


def check_bench_options(args) -> None:
    """Every option bench cannot honour in this combination is refused, naming the conflict (else it is ignored)."""
    if not args.batch_sizes:
        if given(args, "batched_speculation"):
            raise UsageError("--batched-speculation only applies with --batch-sizes (the batched bench): add "
                             "--batch-sizes or drop it.")
        return
    ignored = given(args, *_PLAIN_BENCH_ONLY)
    if ignored:
        raise UsageError(f"--batch-sizes and {', '.join(ignored)} contradict: the batched bench trims one drafter at "
                         "the first --coverages on --dataset, greedy; drop them or drop --batch-sizes.")
    if len(args.coverages) > 1:
        raise UsageError(f"--batch-sizes and {len(args.coverages)} --coverages contradict: the batched bench trims "
                         "one drafter (pass one coverage).")


def cmd_bench(args) -> int:
    if not args.coverages and not args.ks:
        raise UsageError("--coverages and --ks are both empty: nothing to trim and measure (give one of them).")
    check_bench_options(args)
    out = prepare_output(args.output, "bench", overwrite=args.overwrite, parent_must_exist=False)
    check_dataset_name(args.dataset)
    for workload in args.workloads:
        check_dataset_name(workload, "--workloads")
    if args.ks:
        check_ks_in_vocabulary(args.ks, args.target)
    check_drafter_tokenizer(args)
    from tqdm.auto import tqdm

    if args.batch_sizes:
        return _cmd_batch_bench(args, out)
    from ..evaluation.benchmark import BenchConfig, run_benchmark

    draft_length, stop = draft_policy(args)
    cfg = BenchConfig(
        target=args.target, drafter=args.drafter, drafter_dtype=args.drafter_dtype, vocab_dataset=args.dataset,
        count_examples=args.count_examples, coverages=tuple(args.coverages), ks=tuple(args.ks), workloads=tuple(args.workloads),
        modes=tuple(args.modes), prompts=args.prompts, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
        num_draft_tokens=draft_length, confidence_threshold=stop,
        context_tokens=args.context_tokens,
        kernel_levers=args.kernel_levers, ssd=args.ssd, ssd_mode=args.ssd_mode,
        compile_draft_step=args.compile_draft_step, weight_quantization=weight_scheme(args.weight_quantization),
    )
    with output_folder(out):
        report = run_benchmark(cfg, out, progress=lambda s: tqdm(s, desc="generate"))
    from ..evaluation.benchmark import format_report

    print(format_report(report))
    log(f"results: {args.output}/results.json, results.md, throughput_vs_vocab.png, draft_latency_vs_vocab.png")
    return 0


def _cmd_batch_bench(args, out) -> int:
    """bench --batch-sizes: batched target-only vs batched trimmed speculative vs a batch-1 HF assisted loop."""
    from tqdm.auto import tqdm

    from ..evaluation.batch_bench import BatchBenchConfig, format_batch_report, run_batch_bench

    coverage = args.coverages[0] if args.coverages else 0.95
    draft_length, stop = draft_policy(args)
    cfg = BatchBenchConfig(
        target=args.target, drafter=args.drafter, drafter_dtype=args.drafter_dtype, vocab_dataset=args.dataset,
        count_examples=args.count_examples, coverage=coverage, context_tokens=True,
        batch_sizes=tuple(args.batch_sizes), max_new_tokens=args.max_new_tokens, repeats=args.repeats,
        num_draft_tokens=draft_length, confidence_threshold=stop,
        batched_speculation=args.batched_speculation, compile_draft_step=args.compile_draft_step,
        weight_quantization=weight_scheme(args.weight_quantization),
    )
    with output_folder(out):
        report = run_batch_bench(cfg, out, progress=lambda s: tqdm.write(s))
    print(format_batch_report(report))
    log(f"results: {args.output}/results.json, results.md")
    return 0


def cmd_acceptance(args) -> int:
    out = prepare_output(args.output, "acceptance", overwrite=args.overwrite, parent_must_exist=False)
    check_dataset_name(args.dataset)
    check_model_name(args.target, "--target")
    from tqdm.auto import tqdm

    from ..evaluation.acceptance import run_acceptance_report

    with output_folder(out):
        report = run_acceptance_report(args.target, out, dataset=args.dataset, count_examples=args.count_examples,
                                       levels=args.levels, conversations=args.conversations,
                                       temperatures=args.temperatures, num_draft_tokens=args.num_draft_tokens,
                                       progress=lambda s: tqdm(s, desc="score"))
    from ..evaluation.acceptance import format_acceptance

    print(f"{report['positions']} held-out answer positions, {report['conversations']} conversations")
    print(format_acceptance(report))
    print(f"wrote {args.output}/results.json, results.md, acceptance_vs_vocab.png")
    return 0


def cmd_rdk_bench(args) -> int:
    if args.no_generate and given(args, "prompts", "max_new_tokens", "repeats"):
        raise UsageError(f"{', '.join(given(args, 'prompts', 'max_new_tokens', 'repeats'))} only apply to generation, "
                         "which --no-generate skips (drop one of them).")
    out = prepare_output(args.output, "rdk-bench", overwrite=args.overwrite, parent_must_exist=False)
    check_dataset_name(args.dataset)
    check_model_name(args.target, "--target")
    from tqdm.auto import tqdm

    from ..evaluation.rdk_benchmark import RDKBenchConfig, run_rdk_benchmark

    cfg = RDKBenchConfig(
        target=args.target, drafter_dtype=args.drafter_dtype, dataset=args.dataset,
        count_examples=args.count_examples, levels=tuple(args.levels), temperatures=tuple(args.temperatures),
        calibration_sequences=args.calibration_sequences, score_sequences=args.score_sequences,
        num_targets=args.num_targets, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
        repeats=args.repeats, generate=not args.no_generate,
    )
    with output_folder(out):
        report = run_rdk_benchmark(cfg, out, progress=lambda s: tqdm(s, desc="rdk-bench"))
    print((Path(args.output) / "results.md").read_text())
    print(f"done in {report['seconds_total']:.0f} s; results in {args.output}")
    return 0


def cmd_distill(args) -> int:
    """Distil a small same-tokenizer drafter from the target (resumes from --output if it holds a run)."""
    from ..evaluation.distill import DistillConfig, distill

    if args.output is None:
        name = str(args.target).removeprefix("offline:").rstrip("/").split("/")[-1]
        args.output = f"results/distilled/{name}-{args.num_layers}l"
    out = Path(args.output).expanduser()
    if out.exists() and not out.is_dir():
        raise UsageError(f"--output {args.output} is a file, not a folder: choose a folder name (it is created) or "
                         "move the file away.")
    check_dataset_name(args.dataset)
    check_model_name(args.target, "--target")
    cfg = DistillConfig(
        target=args.target, num_layers=args.num_layers, dataset=args.dataset, output_dir=args.output,
        seq_len=args.seq_len, batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup_steps,
        max_steps=args.max_steps, time_budget_s=args.time_budget, seed=args.seed, save_every=args.save_every,
        eval_sequences=args.eval_sequences, target_dtype=args.target_dtype, autocast=not args.no_autocast,
        freeze_embeddings=not args.train_embeddings, overwrite=args.overwrite,
    )
    if cfg.max_steps is None and cfg.time_budget_s is None:
        cfg.max_steps = 1000
    summary = distill(cfg, progress=not args.no_progress)
    if summary.world_size > 1:
        from accelerate import PartialState

        if not PartialState().is_main_process:  # every rank trained; one prints
            return 0
    print(json.dumps(summary.to_dict(), indent=2))
    log(f"student saved to {args.output} (stopped: {summary.stopped}, {summary.world_size} process(es)); "
        f"report: {args.output}/distill_report.json, checkpoints: {summary.checkpoint_dir}")
    return 0



def register(sub) -> None:
    d = sub.add_parser("demo", help="count -> trim -> save -> reload -> generate, vs target-only and HF assisted")
    d.add_argument("--pair", choices=sorted(DEMO_PAIRS), default="g",
                   help="g: Gemma-3-270M + its bf16 copy (default, fast); q: Qwen2.5-Coder 0.5B drafting for 1.5B "
                        "(real pair; `make setup-pair` first)")
    d.add_argument("--target", default=None, help="default: the pair's target")
    d.add_argument("--drafter", default=None, help="default: the pair's drafter (pair g: a reduced-precision copy "
                                                   "of the target)")
    d.add_argument("--drafter-dtype", choices=sorted(DTYPES), default=None,
                   help="default: bfloat16 (pair q: bfloat16 where the CPU has native bf16, else float32)")
    d.add_argument("--dataset", default="offline:sharegpt")
    d.add_argument("--count-examples", type=positive_int, default=4000)
    d.add_argument("--min-coverage", type=coverage_fraction, default=0.99)
    d.add_argument("--prompts", type=positive_int, default=4)
    d.add_argument("--max-new-tokens", type=positive_int, default=64)
    d.add_argument("--max-prompt-tokens", type=positive_int, default=256)
    d.add_argument("--answer-prefix-tokens", type=non_negative_int, default=32,
                   help="prompts carry this many tokens of the reference answer (0: bare chat prompts)")
    draft_policy_args(d)
    d.add_argument("--repeats", type=positive_int, default=1)
    d.add_argument("--threads", type=positive_int, default=None)
    d.add_argument("--strict", action="store_true", help="exit 1 if greedy output differs from target-only")
    d.add_argument("--output", default="results/demo")
    overwrite_arg(d)
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", help="side-by-side benchmark: methods x vocabulary sizes x workloads x modes")
    b.add_argument("--target", default="offline:gemma-3-270m")
    b.add_argument("--drafter", default=None)
    b.add_argument("--drafter-dtype", choices=sorted(DTYPES), default="auto",
                   help=f"{AUTO_DTYPE_HELP} (default: %(default)s)")
    b.add_argument("--dataset", default="offline:sharegpt", help="domain the vocabulary is chosen on")
    b.add_argument("--count-examples", type=positive_int, default=4000)
    b.add_argument("--coverages", type=coverage_fraction, nargs="*", default=[0.9, 0.95, 0.99])
    b.add_argument("--ks", type=positive_int, nargs="*", default=[], help="explicit kept sizes, trimmed besides those of --coverages (e.g. a selected k and neighbours)")
    b.add_argument("--workloads", nargs="+", default=["offline:sharegpt", "offline:humaneval"])
    b.add_argument("--modes", nargs="+", choices=["greedy", "t0.7", "t1"], default=["greedy"])
    b.add_argument("--prompts", type=positive_int, default=3)
    b.add_argument("--max-new-tokens", type=positive_int, default=48)
    b.add_argument("--repeats", type=positive_int, default=2)
    draft_policy_args(b)
    b.add_argument("--context-tokens", action="store_true",
                   help="also run every trimmed k with context tokens on (same drafter, method 'trimmed k=K +context')")
    b.add_argument("--kernel-levers", action="store_true",
                   help="also run target only with the fast linears our generate uses, and every trimmed method "
                        "without them (method names ending 'F.linear'): what the kernels contribute")
    b.add_argument("--compile-draft-step", action="store_true",
                   help="also run every trimmed k with its draft steps compiled (drafter.compile_draft_step; method "
                        "'... compiled steps', the warm-up call pays the compiles); with --batch-sizes the trimmed "
                        "speculative rows run compiled")
    b.add_argument("--weight-quantization", choices=WEIGHT_QUANTIZATION_CHOICES, default="none",
                   help="the trimmed drafters' linear layers as weight-only int8 / int4 (drafter.quantize_weights, "
                        "CPU; method names end with the scheme), as `hf-vocabspec trim --weight-quantization` saves "
                        "them")
    b.add_argument("--ssd", action="store_true",
                   help="also run SSD (speculative speculative decoding) per trimmed k, next to ordinary drafting at 1 thread")
    b.add_argument("--ssd-mode", choices=["worker", "sync"], default="worker",
                   help="worker: drafter in its own process (1 thread each); sync: tree built inline")
    b.add_argument("--batch-sizes", type=positive_int, nargs="+", default=None,
                   help="batched decoding bench instead: batched target-only vs batched trimmed speculative (first "
                        "coverage, context tokens on) vs a loop of batch-1 HF assisted calls, per batch size")
    b.add_argument("--batched-speculation", choices=["auto", "on", "off"], default="auto",
                   help="with --batch-sizes: the batched loop's fallback rule (auto: measured)")
    b.add_argument("--output", default="results/bench")
    overwrite_arg(b)
    b.set_defaults(func=cmd_bench)

    ac = sub.add_parser("acceptance", help="exact expected acceptance vs kept vocabulary: vanilla vs context tokens")
    ac.add_argument("--target", default="offline:gemma-3-270m")
    ac.add_argument("--dataset", default="offline:sharegpt")
    ac.add_argument("--count-examples", type=positive_int, default=4000)
    ac.add_argument("--levels", type=pruned_share, nargs="+", default=[0.5, 0.75, 0.9, 0.95, 0.97], help="pruned shares")
    ac.add_argument("--conversations", type=positive_int, default=24, help="held-out conversations scored")
    ac.add_argument("--temperatures", type=positive_float, nargs="+", default=[1.0, 0.7])
    ac.add_argument("--num-draft-tokens", "--num-assistant-tokens", type=positive_int, default=5, dest="num_draft_tokens")
    ac.add_argument("--output", default="results/acceptance")
    overwrite_arg(ac)
    ac.set_defaults(func=cmd_acceptance)

    rb = sub.add_parser("rdk-bench", help="RDK evidence: acceptance and tau vs kept vocabulary, vanilla vs RDK")
    rb.add_argument("--target", default="offline:gemma-3-270m")
    rb.add_argument("--drafter-dtype", choices=sorted(DTYPES), default="bfloat16")
    rb.add_argument("--dataset", default="offline:sharegpt")
    rb.add_argument("--count-examples", type=positive_int, default=4000)
    rb.add_argument("--levels", type=pruned_share, nargs="+", default=[0.5, 0.75, 0.9, 0.95, 0.97])
    rb.add_argument("--temperatures", type=positive_float, nargs="+", default=[1.0, 0.7])
    rb.add_argument("--calibration-sequences", type=positive_int, default=150)
    rb.add_argument("--score-sequences", type=positive_int, default=12)
    rb.add_argument("--num-targets", type=positive_int, default=8)
    rb.add_argument("--prompts", type=positive_int, default=3)
    rb.add_argument("--max-new-tokens", type=positive_int, default=48)
    rb.add_argument("--repeats", type=positive_int, default=1)
    rb.add_argument("--no-generate", action="store_true", help="only fit and score kernels (no generation)")
    rb.add_argument("--output", default="results/rdk")
    overwrite_arg(rb)
    rb.set_defaults(func=cmd_rdk_bench)

    ds = sub.add_parser("distill", help="distil a small same-tokenizer drafter: the target's first layers, trained by "
                        "KL on transformers' Trainer (accelerate launch ... -m hf_vocabspec.cli distill: N processes)")
    ds.add_argument("--target", default="offline:smollm2-135m-instruct")
    ds.add_argument("--num-layers", type=positive_int, default=4, help="student depth (the target's first N layers)")
    ds.add_argument("--dataset", default="offline:sharegpt", help="chat dataset; trains on assistant positions")
    ds.add_argument("--max-steps", type=positive_int, default=None, help="default 1000 when --time-budget is not given")
    ds.add_argument("--time-budget", type=positive_float, default=None, metavar="SECONDS",
                    help="stop cleanly (eval + save included) within this wall-clock time")
    ds.add_argument("--seq-len", type=positive_int, default=256)
    ds.add_argument("--batch-size", type=positive_int, default=8, help="windows per process and step")
    ds.add_argument("--lr", type=positive_float, default=3e-4)
    ds.add_argument("--warmup-steps", type=non_negative_int, default=10)
    ds.add_argument("--save-every", type=positive_int, default=50)
    ds.add_argument("--eval-sequences", type=positive_int, default=16, help="held-out sequences for top-1 agreement")
    ds.add_argument("--seed", type=int, default=0)
    ds.add_argument("--target-dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="dtype of the target that gives training distributions (agreement is scored vs fp32)")
    ds.add_argument("--no-autocast", action="store_true", help="train the student without bf16 autocast")
    ds.add_argument("--train-embeddings", action="store_true", help="also train the (tied) embeddings / LM head")
    ds.add_argument("--overwrite", action="store_true",
                    help="start afresh instead of resuming from the checkpoints beside --output (<output>.checkpoints)")
    ds.add_argument("--no-progress", action="store_true", help="no progress bar (logs and the summary only)")
    ds.add_argument("--output", default=None, help="default: results/distilled/<target>-<N>l")
    ds.set_defaults(func=cmd_distill)
