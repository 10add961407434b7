"""The pipeline commands: count -> select -> trim (-> push), and fitting an RDK kernel into a drafter."""

from __future__ import annotations

import json
from pathlib import Path

from ._common import (
    AUTO_DTYPE_HELP,
    DTYPES,
    WEIGHT_QUANTIZATION_CHOICES,
    UsageError,
    check_bench_results,
    check_dataset_name,
    check_tokenizer_of,
    check_storage,
    count_for_args,
    is_main_process,
    log,
    given,
    weight_scheme,
    non_negative_int,
    overwrite_arg,
    positive_float,
    positive_int,
    prepare_output,
    refuse_together,
    selection_args,
)


MIN_K = 50  # the smallest kept size the search tries


def measured_or_flops(model, ks, *, measure=None):
    """A plausible measured latency curve, else the FLOPs model: (cost, curve or None, note on which was used).

    Timing on a loaded machine can make a small head look slower than the full one; a flattened curve would
    then make every k look equally cheap. So an implausible curve is measured once more, and if it is still
    implausible the architecture-aware FLOPs model is used, and the note says so."""
    from ..cost import measure_draft_latency

    measure = measure or measure_draft_latency
    why = None
    for attempt in range(2):
        curve = measure(model, ks)
        why = curve.implausibility()
        if why is None:
            return curve, curve, "measured draft-step latency" + (" (second measurement)" if attempt else "")
        log(f"latency curve implausible ({why}); " + ("measuring again" if attempt == 0 else "using the FLOPs model"))
    return model.config, None, f"FLOPs model (measured curve implausible twice: {why})"


def cmd_count(args) -> int:
    prepare_output(args.output, "counts", overwrite=args.overwrite)
    check_dataset_name(args.dataset)
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


def _check_max_k(args) -> None:
    if args.max_k < MIN_K:
        raise UsageError(f"--max-k {args.max_k} is below {MIN_K}, the smallest kept size the search tries: raise --max-k "
                         "or pass --k to keep exactly k tokens (trim).")


def _check_reachable(args, counts) -> None:
    """The coverage constraint must be reachable within --max-k: say so before any timing or search."""
    k_max = min(args.max_k, counts.vocab_size)
    if counts.num_tokens == 0:
        raise UsageError("the counts hold no tokens: count a dataset with assistant turns first.")
    best = counts.coverage(k_max)
    if best < args.min_coverage:
        raise UsageError(f"--min-coverage {args.min_coverage} is unreachable with --max-k {args.max_k}: the best "
                         f"reachable coverage is {best:.4f}; lower --min-coverage or raise --max-k.")


def _check_not_only_special(counts, tokenizer, what: str) -> None:
    """Counts whose tokens are all special (turn markers of empty answers) reach any coverage at the smallest k and say
    nothing about the workload: refuse them rather than report k=50 at 100%."""
    from ..trimming import chat_template_special_ids

    special = sorted({int(i) for i in (*tokenizer.all_special_ids, *chat_template_special_ids(tokenizer))
                      if 0 <= int(i) < counts.vocab_size})
    counted = int(counts.counts.sum())
    if counted and special and int(counts.counts[special].sum()) == counted:
        raise UsageError(f"{what} hold only special tokens (ids {[i for i in special if counts.counts[i]][:5]}): "
                         "the assistant turns counted carry no text, so any coverage is reached at the smallest k; "
                         "count a dataset whose assistant turns hold text.")


def _select(args, counts, model, out_dir: Path):
    """Run the vocabulary search; write selection.json, pareto.png (and latency.png when measured).

    Files are written only after the search succeeded (a refused run leaves no half-filled folder)."""
    from ..evaluation.plots import plot_latency_curve, plot_pareto
    from ..selection import select_vocabulary

    vocab = counts.vocab_size
    curve, cost_note = None, "FLOPs model (--cost flops)"
    if args.cost == "measured":
        ks = sorted({k for k in (1024, 4096, 16384, 65536) if k < vocab} | {vocab})
        log(f"measuring the draft step at k in {ks} (+ body-only floor)")
        cost, curve, cost_note = measured_or_flops(model, ks)
    else:
        cost = model.config
    result = select_vocabulary(
        counts, cost, min_coverage=args.min_coverage, objective=args.objective, n_trials=args.n_trials,
        seed=args.seed, k_range=(MIN_K, min(args.max_k, vocab)), storage=args.storage,
    )
    out_dir.mkdir(parents=True, exist_ok=True)  # inside a temp folder swapped in whole (atomic_directory)
    if curve is not None:
        plot_latency_curve(curve, out_dir / "latency.png")
    plot_pareto(result, out_dir / "pareto.png")
    info = result.to_dict() | {"counts_tokenizer": counts.tokenizer_name, "counts_tokenizer_sha256": counts.tokenizer_sha256,
                               "cost_used": cost_note, "latency_curve": curve.to_dict() if curve else None}
    (out_dir / "selection.json").write_text(json.dumps(info, indent=2))
    log(f"draft cost: {cost_note}")
    return result, curve


def cmd_select(args) -> int:
    from ..coverage import TokenCounts
    from ..evaluation.offline import load_model, load_tokenizer

    from .._io import atomic_directory

    _check_max_k(args)
    out = prepare_output(args.output, "selection", overwrite=args.overwrite)
    check_storage(args.storage)
    counts = TokenCounts.load(args.counts)
    tokenizer = load_tokenizer(args.drafter)
    counts.check_tokenizer(tokenizer, what=f"the counts in {args.counts}")
    _check_reachable(args, counts)
    _check_not_only_special(counts, tokenizer, f"the counts in {args.counts}")
    model = load_model(args.drafter, dtype=DTYPES[args.dtype]).eval()
    state = {}
    atomic_directory(out, lambda tmp: state.update(result=_select(args, counts, model, tmp)[0]))
    result = state["result"]
    log(f"k={result.k:,} coverage={result.coverage:.2%} objective={result.objective}={result.value:.3f} "
         f"predicted draft-step speedup {result.predicted_draft_speedup:.2f}x ({result.cost_source}) -> {args.output}")
    return 0


def _trim_counts(args, tokenizer):
    """(counts, held-out counts or None): count the first --max-examples conversations (evaluation.data.count_split:
    fewer if that would leave under min_held_out(len) held out) and count the rest (up to 1,000) for the reported coverage."""
    from ..coverage import count_assistant_tokens, count_assistant_tokens_distributed
    from ..evaluation.data import count_split
    from ..evaluation.offline import load_chat_dataset

    dataset = load_chat_dataset(args.dataset)
    if not hasattr(dataset, "__len__"):
        return count_for_args(args), None
    counted, held = count_split(dataset, args.max_examples)
    counts = count_assistant_tokens_distributed(counted, tokenizer, progress=True)
    if not is_main_process() or len(held) == 0:
        return counts, None
    held = held.select(range(min(1000, len(held))))
    try:
        held_counts = count_assistant_tokens(held, tokenizer, progress=False, vocab_size=counts.vocab_size)
    except ValueError:  # no assistant turns held out
        return counts, None
    return counts, held_counts


def cmd_trim(args) -> int:
    """count (or --counts) -> select -> trim -> save (-> push); prints a summary."""
    if (args.bench_results or args.private or args.license) and not args.push_to_hub:
        raise UsageError("--bench-results / --private / --license only apply with --push-to-hub REPO_ID.")
    if args.bench_results and not Path(args.bench_results).is_file():
        raise UsageError(f"--bench-results: no such file {args.bench_results!r} (the results.json of `hf-vocabspec bench`).")
    refuse_together(args, "counts", ("dataset", "max_examples"),
                    "--counts is used as counted, nothing is counted from a dataset (drop one of them)")
    refuse_together(args, "k", ("min_coverage", "objective", "cost", "n_trials", "seed", "max_k", "storage"),
                    "--k keeps exactly k tokens and skips the search these options steer (drop one of them)")
    if not args.k:
        _check_max_k(args)
    out = prepare_output(args.output, "drafter", overwrite=args.overwrite)
    check_storage(args.storage)
    if args.bench_results:
        check_bench_results(args.bench_results)
    if not args.counts:
        check_dataset_name(args.dataset)
    from ..coverage import TokenCounts
    from ..evaluation.offline import load_model, load_tokenizer
    from ..trimming import trim_drafter

    tokenizer = load_tokenizer(args.tokenizer or args.drafter)
    if args.target:  # recorded in the drafter's config: it must be a model this drafter can serve
        check_tokenizer_of(args.target, tokenizer, option="--target", other=f"the drafter {args.tokenizer or args.drafter}")
    if args.k and args.k > len(tokenizer):
        raise UsageError(f"--k {args.k} is beyond the vocabulary ({len(tokenizer):,} tokens): pass --k up to "
                         f"{len(tokenizer):,} (or --min-coverage to choose k).")
    held_counts = None
    if args.counts:
        counts = TokenCounts.load(args.counts)
        counts.check_tokenizer(tokenizer, what=f"the counts in {args.counts}")
    else:
        args.tokenizer = args.tokenizer or args.drafter
        counts, held_counts = _trim_counts(args, tokenizer)
        if not is_main_process():
            return 0
    if not args.k:
        _check_reachable(args, counts)
    _check_not_only_special(counts, tokenizer, f"the counts in {args.counts}" if args.counts else "the counts")
    model = load_model(args.drafter, dtype=DTYPES[args.dtype]).eval()
    state = {}

    def build(tmp: Path) -> None:
        """Everything the output folder holds, built beside it and swapped in whole (atomic_directory)."""
        from ..cost import measure_draft_latency
        from ..hub import write_custom_generate

        if args.k:
            k, result = args.k, None
        else:
            result, _ = _select(args, counts, model, tmp / "selection")
            k = result.k
        keep = counts.top_k(k)
        selection = {"method": "top-k by assistant-token count", "k": k, "coverage": counts.coverage(k),
                     "min_coverage": None if args.k else args.min_coverage,
                     "dataset": None if args.counts else getattr(args, "dataset", None),
                     "objective": result.objective if result else "fixed k",
                     "cost_source": result.cost_source if result else None}
        if held_counts is not None:
            selection["held_out_coverage"] = held_counts.coverage_of(keep)
        drafter = trim_drafter(model, keep, tokenizer=tokenizer, target_model=args.target, selection=selection)
        scheme = weight_scheme(args.weight_quantization)
        if scheme:
            drafter.quantize_weights(scheme)
        drafter.compile_draft_step = {"on": True, "off": False, "auto": "auto"}[args.compile_draft_step]
        drafter.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if not args.no_custom_generate:  # target.generate(custom_generate=<out>, trust_remote_code=True)
            write_custom_generate(tmp, str(out.resolve()))
        k_kept = drafter.config.draft_vocab_size
        measured = measure_draft_latency(load_model(args.drafter, dtype=DTYPES[args.dtype]).eval(),
                                         [k_kept, counts.vocab_size])
        state.update(drafter=drafter, k=k, result=result, measured=measured, keep=keep)

    from .._io import atomic_directory

    atomic_directory(out, build)
    drafter, k, result, measured, keep = (state[n] for n in ("drafter", "k", "result", "measured", "keep"))
    k_kept = drafter.config.draft_vocab_size
    # sizes are measured ascending and once each: the trimmed head first, the full head last (the same entry when
    # k is the whole vocabulary: 1x)
    trimmed_s, full_s = measured.seconds[0], measured.seconds[-1]
    speedup = full_s / trimmed_s
    if held_counts is not None:
        coverage, coverage_text = held_counts.coverage_of(keep), (
            f"coverage {held_counts.coverage_of(keep):.2%} of held-out assistant tokens ({held_counts.num_examples:,} "
            f"conversations not counted; {counts.coverage(k):.2%} of the counted ones)")
    else:
        coverage, coverage_text = counts.coverage(k), (
            f"coverage {counts.coverage(k):.2%} of the COUNTED assistant tokens (no held-out text with --counts; "
            "expect less on new text)")
    print(f"kept {k_kept:,} of {drafter.config.vocab_size:,} tokens; {coverage_text}")
    if result:
        print(f"predicted draft-step speedup {result.predicted_draft_speedup:.2f}x ({result.cost_source}); "
              f"Pareto plot: {out / 'selection' / 'pareto.png'}")
    print(f"measured draft-step: {full_s * 1e3:.1f} ms full head -> {trimmed_s * 1e3:.1f} ms "
          f"trimmed ({speedup:.2f}x; body-only floor {measured.floor_seconds * 1e3:.1f} ms)")
    print(f"saved to {out} ({args.dtype} weights)")
    if args.push_to_hub:
        from ..hub import EvalResultRow, push_drafter_to_hub

        workload = f"{args.dataset} (held-out assistant turns)" if held_counts is not None else (
            f"{args.counts} (counts file)" if args.counts else f"{args.dataset} (counted assistant turns)")
        measured_rows = [
            EvalResultRow(metric_type="coverage", metric_name="assistant-token coverage of the kept vocabulary",
                          metric_value=round(coverage, 6), dataset_name=workload),
            EvalResultRow(metric_type="draft_step_speedup",
                          metric_name=f"draft-step speedup vs full head ({args.dtype}, measured)",
                          metric_value=round(speedup, 4), dataset_name=workload),
        ]
        if args.bench_results:  # the bench's results.json is read here, in the tooling; the card takes rows
            from ..evaluation.benchmark import eval_results_from_benchmark

            measured_rows += eval_results_from_benchmark(args.bench_results, drafter.config.draft_vocab_size,
                                                         context_tokens=bool(drafter.config.context_tokens))
        sel_dir = out / "selection"
        extra = {f"selection/{name}": sel_dir / name for name in ("selection.json", "pareto.png", "latency.png")
                 if result is not None and (sel_dir / name).is_file()}
        url = push_drafter_to_hub(
            drafter, args.push_to_hub, tokenizer=tokenizer, eval_results=measured_rows, license=args.license,
            private=args.private, custom_generate=not args.no_custom_generate,
            pareto=None if result is None else result.to_dict()["pareto"] + [
                {"k": result.k, "coverage": result.coverage, "relative_cost": result.relative_draft_cost, "chosen": True}],
            extra_files=extra,
        )
        print(f"pushed to {url}")
    return 0


def cmd_rdk_fit(args) -> int:
    """Fit (or build the prior) RDK kernel for a saved trimmed drafter and save it into the checkpoint."""
    import torch

    from .._io import first_line
    from ..compatibility import check_compatibility
    from ..configuration import TrimmedDrafterConfig
    from ..coverage import count_assistant_tokens
    from ..evaluation.offline import load_chat_dataset, load_model, load_tokenizer
    from ..modeling import TrimmedDrafter, check_drafter_location
    from ..rdk import (
        calibration_sequences,
        collect_calibration,
        embedding_prior_kernel,
        fit_rdk_kernel,
    )

    fitted_only, prior_only = ("sequences", "skip", "temperature"), ("max_examples",)
    if args.method == "prior" and given(args, *fitted_only):
        raise UsageError(f"{', '.join(given(args, *fitted_only))} only apply with --method fitted (drop them).")
    if args.method == "fitted" and given(args, *prior_only):
        raise UsageError("--max-examples only applies with --method prior (drop it).")
    if args.output is not None:
        prepare_output(args.output, "drafter", overwrite=args.overwrite)
    check_dataset_name(args.dataset)
    target_name = args.target
    if not target_name:  # the recorded target, read before the weights (a bad path is refused before any request)
        check_drafter_location(args.drafter)
        try:
            target_name = TrimmedDrafterConfig.from_pretrained(args.drafter).target_model
        except Exception:  # noqa: BLE001 - unreadable: loading the drafter says why, in one line
            target_name = TrimmedDrafter.from_pretrained(args.drafter).config.target_model
    if not target_name and args.method == "fitted":
        raise UsageError(f"--method fitted fits the kernel to the target's distributions, and the drafter {args.drafter} "
                         "does not record its target: pass --target (the model it serves; `trim --target` records it), "
                         "or use --method prior (it needs the tokenizer only).")
    # the prior needs only the tokenizer: the target's, or the one saved with the drafter (`trim` saves it there)
    tokenizer_name = target_name or args.drafter
    try:
        tokenizer = load_tokenizer(tokenizer_name)
    except Exception as err:  # noqa: BLE001 - no tokenizer saved with the drafter: say what to pass
        if target_name:
            raise
        raise UsageError(f"The drafter {args.drafter} holds no tokenizer and does not record its target "
                         f"({first_line(err)}): pass --target (the model it serves).") from err
    drafter = TrimmedDrafter.from_pretrained(args.drafter)
    check_compatibility(drafter, tokenizer=tokenizer, fix=f"pass as --target the model the drafter {args.drafter} serves "
                        f"(not {tokenizer_name})")
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
    c.add_argument("--dataset", default="offline:sharegpt",
                   help="chat dataset: Hub id, local .json/.jsonl/.parquet/.csv, or offline name")
    c.add_argument("--max-examples", type=positive_int, default=None, help="count only the first N conversations (default: all)")
    c.add_argument("--output", default="counts.safetensors", help="counts file to write (safetensors)")
    overwrite_arg(c)
    c.set_defaults(func=cmd_count)

    t = sub.add_parser("trim", help="trim a drafter's LM head to the tokens that cover the workload")
    t.add_argument("--drafter", default="offline:smollm2-135m-instruct", help="base drafter: Hub id, directory or offline name")
    t.add_argument("--target", default=None, help="the target model id this drafter serves (recorded)")
    t.add_argument("--tokenizer", default=None, help="defaults to the drafter's")
    t.add_argument("--counts", default=None, help="counts file from `hf-vocabspec count` (else count now)")
    t.add_argument("--dataset", default="offline:sharegpt",
                   help="chat dataset counted when no --counts (the rest is held out for the reported coverage)")
    t.add_argument("--max-examples", type=positive_int, default=5000,
                   help="conversations counted (fewer if that would leave under 500 held out)")
    selection_args(t)
    t.add_argument("--k", type=positive_int, default=None, help="keep exactly the top-k tokens (skips the search)")
    t.add_argument("--dtype", choices=sorted(DTYPES), default="auto",
                   help=f"drafter weights dtype ({AUTO_DTYPE_HELP}; default: %(default)s)")
    t.add_argument("--weight-quantization", choices=WEIGHT_QUANTIZATION_CHOICES, default="none",
                   help="weight-only quantized drafter (CPU int kernels; changes acceptance, never the output; "
                        "`hf-vocabspec tune --weight-quantizations none int8 int4` measures which pays)")
    t.add_argument("--compile-draft-step", nargs="?", const="on", choices=("auto", "on", "off"), default="off",
                   help="the drafter's compile_draft_step: on (alone: the flag) = generate runs its one-token steps "
                        "compiled from the first call (torch.compile; that call pays the compiles, later calls reuse "
                        "them); auto = once its eager steps have cost what the compiles are expected to (long jobs); "
                        "off = always eager (default: %(default)s)")
    t.add_argument("--push-to-hub", default=None, metavar="REPO_ID",
                   help="also push the drafter with a model card (HF_TOKEN / `hf auth login`; HF_ENDPOINT honoured)")
    t.add_argument("--private", action="store_true", help="with --push-to-hub: create the repo private")
    t.add_argument("--license", default=None, help="card licence (default: inherited from the base drafter/target)")
    t.add_argument("--bench-results", default=None, metavar="RESULTS_JSON",
                   help="with --push-to-hub: add this kept size's rows of an `hf-vocabspec bench` results.json to the card")
    t.add_argument("--no-custom-generate", action="store_true",
                   help="do not write/push the custom_generate/ recipe (target.generate(custom_generate=repo))")
    t.add_argument("--output", default="trimmed-drafter",
                   help="directory to save the drafter to (an earlier drafter there is replaced whole)")
    overwrite_arg(t)
    t.set_defaults(func=cmd_trim)

    se = sub.add_parser("select", help="choose the kept vocabulary size: TPE under a coverage constraint")
    se.add_argument("--counts", required=True, help="counts file from `hf-vocabspec count`")
    se.add_argument("--drafter", default="offline:smollm2-135m-instruct", help="drafter whose step cost is modelled")
    se.add_argument("--dtype", choices=sorted(DTYPES), default="auto",
                    help=f"drafter dtype for the timing ({AUTO_DTYPE_HELP}; default: %(default)s)")
    selection_args(se)
    se.add_argument("--output", default="selection", help="directory for selection.json, pareto.png, latency.png")
    overwrite_arg(se)
    se.set_defaults(func=cmd_select)

    rf = sub.add_parser("rdk-fit", help="fit an RDK kernel (out-of-vocabulary sampling) into a saved trimmed drafter")
    rf.add_argument("drafter", help="directory or repo of a trimmed drafter")
    rf.add_argument("--target", default=None, help="default: the target recorded in the drafter (`trim --target`); "
                    "--method prior needs none: it reads the tokenizer saved with the drafter")
    rf.add_argument("--dataset", default="offline:sharegpt", help="calibration chat dataset")
    rf.add_argument("--method", choices=["fitted", "prior"], default="fitted",
                    help="fitted on target distributions, or the embedding-similarity prior")
    rf.add_argument("--sequences", type=positive_int, default=150, help="calibration assistant turns (fitted)")
    rf.add_argument("--skip", type=non_negative_int, default=0, help="skip this many assistant turns (e.g. those counted)")
    rf.add_argument("--max-examples", type=positive_int, default=4000, help="conversations counted (prior)")
    rf.add_argument("--temperature", type=positive_float, default=1.0, help="sampling temperature the kernel is fitted for")
    rf.add_argument("--num-targets", type=positive_int, default=8, help="pruned neighbours per kept token (m)")
    rf.add_argument("--output", default=None, help="default: overwrite the drafter directory")
    overwrite_arg(rf)
    rf.set_defaults(func=cmd_rdk_fit)
