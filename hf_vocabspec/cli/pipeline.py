"""The pipeline commands: count -> select -> trim (-> push), and fitting an RDK kernel into a drafter."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ._common import DTYPES, count_for_args, is_main_process, log, selection_args


def cmd_count(args) -> int:
    counts = count_for_args(args)
    if not is_main_process():
        return 0
    counts.save(args.output)
    from accelerate import PartialState

    log(f"counted on {PartialState(cpu=True).num_processes} process(es)")
    log(f"counted {counts.num_tokens:,} assistant tokens in {counts.num_assistant_turns:,} turns -> {args.output}")
    for c in (0.9, 0.95, 0.99):
        log(f"  coverage {c:.0%}: top-{counts.smallest_k_for_coverage(c):,} tokens")
    return 0


def _select(args, counts, model, out_dir: Path):
    """Run the vocabulary search; write selection.json, pareto.png (and latency.png when measured)."""
    from ..cost import measure_draft_latency
    from ..selection import select_vocabulary

    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = counts.vocab_size
    curve = None
    if args.cost == "measured":
        ks = sorted({k for k in (1024, 4096, 16384, 65536) if k < vocab} | {vocab})
        log(f"measuring the draft step at k in {ks} (+ body-only floor)")
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
    from ..coverage import TokenCounts
    from ..evaluation.offline import load_model

    counts = TokenCounts.load(args.counts)
    model = load_model(args.drafter, dtype=DTYPES[args.dtype]).eval()
    result, _ = _select(args, counts, model, Path(args.output))
    log(f"k={result.k:,} coverage={result.coverage:.2%} objective={result.objective}={result.value:.3f} "
         f"predicted draft-step speedup {result.predicted_draft_speedup:.2f}x ({result.cost_source}) -> {args.output}")
    return 0


def cmd_trim(args) -> int:
    """count (or --counts) -> select -> trim -> save (-> push); prints a summary."""
    if (args.bench_results or args.private or args.license) and not args.push_to_hub:
        raise SystemExit("--bench-results / --private / --license only apply with --push-to-hub REPO_ID.")
    if args.bench_results and not Path(args.bench_results).is_file():
        raise SystemExit(f"--bench-results: no such file {args.bench_results!r} (the results.json of `hf-vocabspec bench`).")
    from ..cost import measure_draft_latency
    from ..coverage import TokenCounts
    from ..drafter import trim_drafter
    from ..evaluation.offline import load_model, load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer or args.drafter)
    if args.counts:
        counts = TokenCounts.load(args.counts)
    else:
        args.tokenizer = args.tokenizer or args.drafter
        counts = count_for_args(args)
        if not is_main_process():
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
    from ..hub import write_custom_generate

    if not args.no_custom_generate:  # target.generate(custom_generate=<out>, trust_remote_code=True)
        write_custom_generate(out, str(out.resolve()))
    if args.push_to_hub:
        from ..hub import push_drafter_to_hub

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


def cmd_rdk_fit(args) -> int:
    """Fit (or build the prior) RDK kernel for a saved trimmed drafter and save it into the checkpoint."""
    from ..coverage import count_assistant_tokens
    from ..drafter import TrimmedDrafter
    from ..evaluation.offline import load_chat_dataset, load_model, load_tokenizer
    from ..rdk import (
        calibration_sequences,
        collect_calibration,
        embedding_prior_kernel,
        fit_rdk_kernel,
    )

    drafter = TrimmedDrafter.from_pretrained(args.drafter)
    target_name = args.target or drafter.config.target_model
    if not target_name:
        raise SystemExit("The drafter does not record its target: pass --target (the model whose distributions to fit).")
    tokenizer = load_tokenizer(target_name)
    dataset = load_chat_dataset(args.dataset)
    if args.method == "fitted":
        log(f"calibrating on {args.sequences} assistant turns of {args.dataset} with {target_name} (T={args.temperature})")
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



def register(sub) -> None:
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
    selection_args(t)
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
    selection_args(se)
    se.add_argument("--output", default="selection")
    se.set_defaults(func=cmd_select)

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
