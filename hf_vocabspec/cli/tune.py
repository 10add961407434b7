"""``hf-vocabspec tune``: joint search over kept size k, draft length L and context tokens (issue #15)."""

from __future__ import annotations

from ._common import (
    AUTO_DTYPE_HELP,
    DTYPES,
    WEIGHT_QUANTIZATION_CHOICES,
    UsageError,
    check_dataset_name,
    check_storage,
    check_ks_in_vocabulary,
    confidence_threshold,
    coverage_fraction,
    given,
    weight_scheme,
    log,
    non_negative_int,
    output_folder,
    overwrite_arg,
    positive_int,
    prepare_output,
    refuse_together,
    sampling_mode,
)


def cmd_tune(args) -> int:
    refuse_together(args, "ks", ("coverages",), "--ks replaces the kept sizes --coverages would choose (drop one)")
    if given(args, "confidence_thresholds") and (args.mode != "greedy" or args.acceptance != "drafter"):
        conflict = f"--mode {args.mode}" if args.mode != "greedy" else f"--acceptance {args.acceptance}"
        raise UsageError(f"--confidence-thresholds and {conflict} contradict: thresholds are simulated on greedy round "
                         "profiles of the real drafter only (--mode greedy --acceptance drafter); drop one of them.")
    if not args.validate and given(args, "validate_draft_lengths", "validate_on"):
        raise UsageError(f"{', '.join(given(args, 'validate_draft_lengths', 'validate_on'))} only apply with "
                         "--validate PROMPTS (add it or drop them).")
    out = prepare_output(args.output, "tune", overwrite=args.overwrite, parent_must_exist=False)
    check_dataset_name(args.dataset)
    if args.ks:
        check_ks_in_vocabulary(args.ks, args.target)
    check_storage(args.storage)
    from .evaluation import check_drafter_tokenizer

    check_drafter_tokenizer(args)
    from tqdm.auto import tqdm

    from ..evaluation.tune import format_tune

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    log(f"measuring acceptance, draft latency per k and verify latency per L+1 for {args.target}")
    with output_folder(out):
        report = _run(args, out, tqdm)
    print(format_tune(report))
    if "validation" in report:
        from ..evaluation.tune import format_validation

        print(format_validation(report["validation"]))
    print(f"report: {args.output}/tune.json, heat map: {args.output}/heatmap.png"
          + ("" if args.no_save else f", tuned drafter: {args.output}/drafter"))
    return 0


def _run(args, out, tqdm) -> dict:
    from ..evaluation.tune import run_tune

    return run_tune(
        args.target, args.drafter or args.target, out, dataset=args.dataset,
        count_examples=args.count_examples, conversations=args.conversations, coverages=args.coverages,
        ks=args.ks, draft_lengths=args.draft_lengths, mode=args.mode, drafter_dtype=DTYPES[args.drafter_dtype],
        n_trials=args.n_trials, storage=args.storage, seed=args.seed, repeats=args.repeats,
        save_drafter=not args.no_save, validate_prompts=args.validate, validate_draft_lengths=args.validate_draft_lengths,
        validate_on=args.validate_on,
        max_new_tokens=args.max_new_tokens, acceptance=args.acceptance,
        confidence_thresholds=args.confidence_thresholds,
        weight_quantizations=[weight_scheme(w) for w in args.weight_quantizations],
        compile_draft_step=args.compile_draft_step,
        progress=lambda xs: tqdm(xs, leave=False),
    )


def register(sub) -> None:
    t = sub.add_parser("tune", help="choose kept size k, draft length L and context tokens together (predicted tokens/s)")
    t.add_argument("--target", default="offline:gemma-3-270m")
    t.add_argument("--drafter", default=None, help="untrimmed drafter (default: the target's weights)")
    t.add_argument("--drafter-dtype", choices=sorted(DTYPES), default="auto",
                   help=f"the drafter's dtype, timed and saved ({AUTO_DTYPE_HELP}; default: %(default)s)")
    t.add_argument("--dataset", default="offline:sharegpt")
    t.add_argument("--count-examples", type=positive_int, default=4000)
    t.add_argument("--conversations", type=positive_int, default=16, help="held-out conversations scored")
    t.add_argument("--coverages", type=coverage_fraction, nargs="+", default=[0.9, 0.95, 0.97, 0.98, 0.99, 0.995],
                   help="kept sizes searched: the smallest k reaching each coverage")
    t.add_argument("--ks", type=positive_int, nargs="+", default=None, help="explicit kept sizes (instead of --coverages)")
    t.add_argument("--draft-lengths", type=positive_int, nargs="+", default=[2, 3, 4, 5, 6, 8, 10, 12])
    t.add_argument("--confidence-thresholds", type=confidence_threshold, nargs="+", default=[0.0, 0.2, 0.3, 0.4, 0.5, 0.6],
                   help="stop a round's drafting after a draft the drafter gives less probability than this "
                        "(0 = never); searched with k and L (with --mode greedy and --acceptance drafter only)")
    t.add_argument("--weight-quantizations", nargs="+", choices=WEIGHT_QUANTIZATION_CHOICES, default=["none"],
                   help="drafter weights searched with k and L: none (as loaded), int8 / int4 weight-only (CPU; each "
                        "measured on its own: acceptance and draft latency; the tuned drafter is saved with it)")
    t.add_argument("--compile-draft-step", action="store_true",
                   help="time (and validate) the draft steps compiled, as drafter.compile_draft_step = True runs them "
                        "(the first timed step pays the compile); the choice is then for a drafter used that way")
    t.add_argument("--mode", type=sampling_mode, default="greedy", help="'greedy' or 't<temperature>' (e.g. t1, t0.7)")
    t.add_argument("--n-trials", type=positive_int, default=None, help="default: the whole grid (exact argmax)")
    t.add_argument("--storage", default=None, help="journal file (or sqlite:///...) to resume the study")
    t.add_argument("--seed", type=int, default=42)
    t.add_argument("--repeats", type=positive_int, default=7, help="timed forwards per latency point")
    t.add_argument("--threads", type=positive_int, default=None)
    t.add_argument("--no-save", action="store_true", help="do not write the tuned drafter")
    t.add_argument("--validate", type=non_negative_int, default=0, metavar="PROMPTS",
                   help="also measure the tuned setting next to its neighbours (3 k x --validate-draft-lengths, "
                        "interleaved, same context setting) on this many held-out prompts, and print its rank")
    t.add_argument("--validate-draft-lengths", type=positive_int, nargs="+", default=[3, 5, 8, 12])
    t.add_argument("--validate-on", choices=["held-out", "scored"], default="held-out",
                   help="held-out: other prompts, 3 kept sizes (tests the choice); scored: the scored prompts at "
                        "the tuned k (tests the simulation: greedy walks the scored path)")
    t.add_argument("--max-new-tokens", type=positive_int, default=64,
                   help="per prompt: the target's continuation scored (--acceptance drafter) and --validate's generation")
    t.add_argument("--acceptance", choices=["drafter", "ideal"], default="drafter",
                   help="drafter: the real trimmed drafter's acceptance along the target's greedy continuation, "
                        "rounds simulated; ideal: ideal trimmed drafter x scalar agreement (older, optimistic)")
    t.add_argument("--output", default="tune")
    overwrite_arg(t)
    t.set_defaults(func=cmd_tune)
