"""Rounds of few rows drafting the drafter's L with its confidence stop, against the cap of 5 for every batch.

The drafter's L (12) with a confidence stop is a cap where a stop cannot end a round's drafting: a round of several
rows drafts on while any of its rows is sure, so rounds of ``configuration.CAPPED_FROM_ROWS`` rows or more draw at
most ``CAPPED_DRAFT_LENGTH`` (5); rounds of fewer rows draft up to L (``generation/hooks.py`` ``_draft_length``).
This times that rule against the cap for every round of --against rows or more (2: the rule before it), on the default
drafter (``trim_drafter`` at --coverage, no tune; the auto dtype), the job's prompts in left-padded batches of
--batch-size (every prompt once per pass), greedy, against batched target-only with the same fast linears in
inference mode (as ``hf-vocabspec bench`` times it). The three methods run batch by batch, their order turned
each pass; --passes passes after one untimed batch. Reports each method's seconds and ratio per pass, accepted
tokens per row and round, and whether every row equals target-only's.

Prints a markdown table naming the machine and writes results.json / results.md under --output.

Smallest check: python scripts/bench_draft_cap.py --prompts 2 --batch-size 2 --passes 1 --max-new-tokens 4 \
    --count-examples 200 --output /tmp/bench-draft-cap
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from unittest import mock

import torch

from hf_vocabspec.configuration import CAPPED_DRAFT_LENGTH, CAPPED_FROM_ROWS
from hf_vocabspec.evaluation.batch_bench import eos_ids, left_padded, target_only_call, timed_call
from hf_vocabspec.evaluation.benchmark import (
    default_drafter_job,
    default_drafter_job_args,
    machine_info,
    write_job_report,
)
from hf_vocabspec.generation import hooks

TITLE = __doc__.splitlines()[0].rstrip(".")
TARGET, RULE = "target only (fast linears)", f"capped from {CAPPED_FROM_ROWS} rows (the rule)"


def main() -> None:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--batch-size", type=int, default=2, help="rows per left-padded batch")
    ap.add_argument("--passes", type=int, default=2, help="timed passes over the job, after one untimed batch")
    ap.add_argument("--against", type=int, default=2,
                    help="the other method caps rounds of this many rows or more (2: the rule before CAPPED_FROM_ROWS)")
    args = default_drafter_job_args(TITLE, prompts=8, output="results/bench-draft-cap", parents=(ap,))
    CAPPED = f"capped from {args.against} rows" + (" (before)" if args.against == 2 else "")
    job = default_drafter_job(args)
    pad = int(job.target.generation_config.pad_token_id or 0)
    eos = eos_ids(job.target)
    gen = {"do_sample": False, "max_new_tokens": args.max_new_tokens, "pad_token_id": pad}
    batches = [left_padded(job.prompts[i:i + args.batch_size], pad)
               for i in range(0, len(job.prompts), args.batch_size)]

    def drafter(ids, mask, capped_from: int):
        with mock.patch.object(hooks, "CAPPED_FROM_ROWS", capped_from), torch.no_grad():
            return [(job.target.generate(input_ids=ids, attention_mask=mask, assistant_model=job.drafter, **gen),
                     ids.shape[1])]

    calls = {TARGET: lambda ids, mask: target_only_call(job.target, ids, mask, gen),
             RULE: lambda ids, mask: drafter(ids, mask, CAPPED_FROM_ROWS),
             CAPPED: lambda ids, mask: drafter(ids, mask, args.against)}
    for call in calls.values():  # untimed: kernel choices, the adapted stop's first records
        call(*batches[0])
    seconds = {name: [0.0] * args.passes for name in calls}
    counts = {name: [0, 0] for name in (RULE, CAPPED)}  # accepted, row-rounds
    equal = {name: True for name in (RULE, CAPPED)}
    for p in range(args.passes):
        order = list(calls) if p % 2 == 0 else list(calls)[::-1]
        for ids, mask in batches:
            outputs = {}
            for name in order:
                result = timed_call(lambda: calls[name](ids, mask), ids.shape[1], eos, pad)
                seconds[name][p] += result.seconds
                outputs[name] = result.outputs
                if name != TARGET:
                    stats = job.drafter.last_speculation_stats
                    counts[name][0] += stats.accepted
                    counts[name][1] += stats.row_rounds
            for name in (RULE, CAPPED):
                equal[name] &= outputs[name] == outputs[TARGET]
    ratios = {name: [t / s for t, s in zip(seconds[TARGET], seconds[name])] for name in (RULE, CAPPED)}
    report = {"config": vars(args) | {"kept_vocab": job.kept_vocab, "dtype": str(job.dtype),
                                      "capped_draft_length": CAPPED_DRAFT_LENGTH},
              "machine": machine_info(), "seconds": seconds, "vs_target_only": ratios,
              "accepted_per_row_round": {n: a / max(r, 1) for n, (a, r) in counts.items()}, "rows_equal": equal}
    lines = [f"# {TITLE}: {len(job.prompts)} of {args.target}'s held-out prompts in batches of {args.batch_size}, "
             f"{args.max_new_tokens} new tokens, k = {job.kept_vocab}, {job.dtype}, {args.passes} passes", "",
             f"machine: {report['machine']}", "",
             "| method | seconds per pass | vs target-only per pass (median) | accepted per row and round | rows equal "
             "target-only |", "|---|---|---|---|---|",
             f"| {TARGET} | {' / '.join(f'{s:.1f}' for s in seconds[TARGET])} | - | - | - |"]
    for name in (RULE, CAPPED):
        lines.append(f"| {name} | {' / '.join(f'{s:.1f}' for s in seconds[name])} | "
                     f"{' / '.join(f'{r:.2f}x' for r in ratios[name])} ({statistics.median(ratios[name]):.2f}x) | "
                     f"{report['accepted_per_row_round'][name]:.2f} | {'yes' if equal[name] else 'NO'} |")
    write_job_report(Path(args.output), report, lines)


if __name__ == "__main__":
    main()
