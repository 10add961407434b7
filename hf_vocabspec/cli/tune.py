"""``hf-vocabspec tune``: joint search over kept size k, draft length L and context tokens (issue #15)."""

from __future__ import annotations

from ._common import DTYPES, log


def cmd_tune(args) -> int:
    from tqdm.auto import tqdm

    from ..evaluation.tune import format_tune, run_tune

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    log(f"measuring acceptance, draft latency per k and verify latency per L+1 for {args.target}")
    report = run_tune(
        args.target, args.drafter or args.target, args.output, dataset=args.dataset,
        count_examples=args.count_examples, conversations=args.conversations, coverages=args.coverages,
        ks=args.ks, draft_lengths=args.draft_lengths, mode=args.mode, drafter_dtype=DTYPES[args.drafter_dtype],
        n_trials=args.n_trials, storage=args.storage, seed=args.seed, repeats=args.repeats,
        save_drafter=not args.no_save, validate_prompts=args.validate, validate_draft_lengths=args.validate_draft_lengths,
        max_new_tokens=args.max_new_tokens, acceptance=args.acceptance, progress=lambda xs: tqdm(xs, leave=False),
    )
    print(format_tune(report))
    if "validation" in report:
        from ..evaluation.tune import format_validation

        print(format_validation(report["validation"]))
    print(f"report: {args.output}/tune.json, heat map: {args.output}/heatmap.png"
          + ("" if args.no_save else f", tuned drafter: {args.output}/drafter"))
    return 0


def register(sub) -> None:
    t = sub.add_parser("tune", help="choose kept size k, draft length L and context tokens together (predicted tokens/s)")
    t.add_argument("--target", default="offline:gemma-3-270m")
    t.add_argument("--drafter", default=None, help="untrimmed drafter (default: the target's weights)")
    t.add_argument("--drafter-dtype", choices=sorted(DTYPES), default="bfloat16")
    t.add_argument("--dataset", default="offline:sharegpt")
    t.add_argument("--count-examples", type=int, default=4000)
    t.add_argument("--conversations", type=int, default=16, help="held-out conversations scored")
    t.add_argument("--coverages", type=float, nargs="+", default=[0.9, 0.95, 0.97, 0.98, 0.99, 0.995],
                   help="kept sizes searched: the smallest k reaching each coverage")
    t.add_argument("--ks", type=int, nargs="+", default=None, help="explicit kept sizes (instead of --coverages)")
    t.add_argument("--draft-lengths", type=int, nargs="+", default=[2, 3, 4, 5, 6, 8, 10, 12])
    t.add_argument("--mode", default="greedy", help="'greedy' or 't<temperature>' (e.g. t1, t0.7)")
    t.add_argument("--n-trials", type=int, default=None, help="default: the whole grid (exact argmax)")
    t.add_argument("--storage", default=None, help="journal file (or sqlite:///...) to resume the study")
    t.add_argument("--seed", type=int, default=42)
    t.add_argument("--repeats", type=int, default=7, help="timed forwards per latency point")
    t.add_argument("--threads", type=int, default=None)
    t.add_argument("--no-save", action="store_true", help="do not write the tuned drafter")
    t.add_argument("--validate", type=int, default=0, metavar="PROMPTS",
                   help="also measure the tuned setting next to its neighbours (3 k x --validate-draft-lengths, "
                        "interleaved, same context setting) on this many held-out prompts, and print its rank")
    t.add_argument("--validate-draft-lengths", type=int, nargs="+", default=[3, 5, 8, 12])
    t.add_argument("--max-new-tokens", type=int, default=64,
                   help="per prompt: the target's continuation scored (--acceptance drafter) and --validate's generation")
    t.add_argument("--acceptance", choices=["drafter", "ideal"], default="drafter",
                   help="drafter: the real trimmed drafter's acceptance along the target's greedy continuation, "
                        "rounds simulated; ideal: ideal trimmed drafter x scalar agreement (older, optimistic)")
    t.add_argument("--output", default="tune")
    t.set_defaults(func=cmd_tune)
