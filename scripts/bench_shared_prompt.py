"""A drafter whose body is the target's taking the target's prompt cache, against it reading the prompt itself.

A drafter trimmed from the target itself (pair G) takes the target's prompt cache by default (the target's own first
step, then the drafter's cache a copy of the target's: generation/engine.py ``_take_prompt``);
``drafter.share_prompt_cache = False`` has it read the prompt itself, in its first round.

Batch 1 (the default): one process, methods interleaved prompt by prompt (benchmark.compare_methods, one pass):
target-only with the same fast linears, the default drafter (``trim_drafter`` at --coverage, no tune; the auto dtype)
as generate runs it, and the same drafter reading the prompt. Reports each method's seconds against target-only, its
mean draft step and how many prompts' outputs equal the first drafter's (the target's output: greedy and exact, so
both must).

--batch-sizes 2 4: instead, the job's first b prompts as one left-padded batch per size, the three methods
interleaved call by call (target-only with the same fast linears in inference mode, as `hf-vocabspec bench` times
it), --repeats times after one untimed round; the median and range of each drafter's tokens/s against target-only,
and whether its rows equal target-only's.

Prints a markdown table naming the machine and writes results.json / results.md under --output.

Smallest checks: python scripts/bench_shared_prompt.py --prompts 2 --max-new-tokens 4 --count-examples 200 \
    --output /tmp/bench-shared-prompt [--batch-sizes 2 --repeats 1]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from hf_vocabspec.evaluation.batch_bench import eos_ids, left_padded, target_only_call, timed_call
from hf_vocabspec.evaluation.benchmark import (
    applied_attrs,
    default_drafter_job,
    default_drafter_job_args,
    drafter_switch_job,
    machine_info,
    write_job_report,
)

TITLE = __doc__.splitlines()[0].rstrip(".")


def batched(args, job, sizes: list[int], repeats: int) -> None:
    pad = int(job.target.generation_config.pad_token_id or 0)
    eos = eos_ids(job.target)
    gen = {"do_sample": False, "max_new_tokens": args.max_new_tokens, "pad_token_id": pad}
    report = {"config": vars(args) | {"kept_vocab": job.kept_vocab, "dtype": str(job.dtype), "batch_sizes": sizes,
                                      "repeats": repeats}, "machine": machine_info(), "runs": []}
    lines = [f"# {TITLE}: batches of the first b of {args.target}'s held-out prompts, {args.max_new_tokens} new "
             f"tokens, k = {job.kept_vocab}, {job.dtype}, {repeats} repeats (median, range)", "",
             f"machine: {report['machine']}", "",
             "| batch | target-only tok/s | prompt cache taken | prompt read by the drafter | rows equal target-only |",
             "|---|---|---|---|---|"]
    for b in sizes:
        ids, mask = left_padded(job.prompts[:b], pad)
        P = ids.shape[1]

        def drafter(share: bool):
            with applied_attrs(job.drafter, {"share_prompt_cache": share}), torch.no_grad():
                return [(job.target.generate(input_ids=ids, attention_mask=mask, assistant_model=job.drafter,
                                             **gen), P)]

        calls = {"target only (fast linears)": lambda: target_only_call(job.target, ids, mask, gen),
                 "prompt cache taken": lambda: drafter(True),
                 "prompt read by the drafter": lambda: drafter(False)}
        rates: dict[str, list[float]] = {name: [] for name in calls}
        outputs = {}
        for rep in range(repeats + 1):  # the first round warms up (kernel choices), dropped
            for name, call in calls.items():
                result = timed_call(call, P, eos, pad)
                outputs[name] = result.outputs
                if rep:
                    rates[name].append(result.new_tokens / result.seconds)
        base = rates["target only (fast linears)"]
        run = {"batch": b, "tokens_per_s": rates, "vs_target_only": {}, "rows_equal": {}}
        cells = []
        for name in list(calls)[1:]:
            ratios = [x / y for x, y in zip(rates[name], base)]
            run["vs_target_only"][name] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
            run["rows_equal"][name] = outputs[name] == outputs["target only (fast linears)"]
            cells.append(f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
        report["runs"].append(run)
        equal = "/".join("yes" if v else "NO" for v in run["rows_equal"].values())
        lines.append(f"| {b} | {statistics.median(base):.2f} | {cells[0]} | {cells[1]} | {equal} |")
    write_job_report(Path(args.output), report, lines)


def main() -> None:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[],
                    help="time left-padded batches of these sizes instead of batch 1 (default: batch 1)")
    ap.add_argument("--repeats", type=int, default=2, help="timed rounds per batch size, after one untimed")
    args = default_drafter_job_args(TITLE, prompts=8, output="results/bench-shared-prompt", parents=(ap,))
    if args.batch_sizes:
        args.prompts = max(args.prompts, *args.batch_sizes)
        batched(args, default_drafter_job(args), args.batch_sizes, args.repeats)
        return
    drafter_switch_job(TITLE, switch="share_prompt_cache", on="prompt cache taken", off="prompt read by the drafter",
                       prompts=8, output=args.output, args=args)


if __name__ == "__main__":
    main()
