"""What ``compile_draft_step="auto"`` does for the default drafter over a job of many prompts.

One process, methods interleaved prompt by prompt (benchmark.compare_methods, one pass): target-only with the same
fast linears, the default drafter (``trim_drafter`` at --coverage, no tune) with its steps held eager
(``compile_draft_step=False``), and the same drafter with ``"auto"`` (eager until its eager steps have cost
``autocompile.AUTO_COMPILE_AFTER_SECONDS``, then compiled, the compiles paid inside the job). Reports each method's
tokens/s over the whole job and against target-only, and the auto rule's record (eager seconds, when it compiled,
its verdict); with --compiled, ``compile_draft_step=True`` in place of "auto". Target in bf16 where the CPU has
native bf16. Writes results.json and results.md under --output.

Smallest check: python scripts/bench_auto_compile.py --prompts 2 --max-new-tokens 4 --count-examples 200 \
    --output /tmp/bench-auto
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hf_vocabspec.evaluation.benchmark import (Method, compare_methods, default_drafter_job, default_drafter_job_args,
                                               job_rows, machine_info, write_job_report)
from hf_vocabspec.generation import autocompile


def main() -> None:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--compiled", action="store_true",
                    help='time the drafter with compile_draft_step=True (compiled from its first call; the untimed '
                         'warm-up call pays the first graph, later buckets within the job) instead of "auto" (the '
                         'two would share the drafter\'s graphs and records)')
    args = default_drafter_job_args(__doc__.splitlines()[0], prompts=40, output="results/bench-auto-compile",
                                    parents=(ap,))
    out = Path(args.output)
    t0 = time.time()
    job = default_drafter_job(args)
    target, drafter, k, dtype, prompts = job.target, job.drafter, job.kept_vocab, job.dtype, job.prompts
    drafter.compile_draft_step = autocompile.AUTO
    methods = [Method("target only (fast linears)", fast_linears=True),
               Method("default drafter, steps eager", drafter, attrs={"compile_draft_step": False}),
               Method("default drafter, steps compiled (True)", drafter, attrs={"compile_draft_step": True})
               if args.compiled else Method('default drafter ("auto")', drafter)]
    res = compare_methods(target, methods, prompts, max_new_tokens=args.max_new_tokens, repeats=1,
                          generate_kwargs={"do_sample": False})
    rows = job_rows(res, methods)
    record = vars(autocompile.record_of(drafter))
    report = {"config": vars(args) | {"kept_vocab": k, "dtype": str(dtype),
                                       "auto_compile_after_seconds": autocompile.AUTO_COMPILE_AFTER_SECONDS},
              "machine": machine_info(), "rows": rows, "auto_record": record, "seconds_total": time.time() - t0}
    setting = "True" if args.compiled else '"auto"'
    lines = [f"# compile_draft_step={setting} over {len(prompts)} prompts x {args.max_new_tokens} new tokens",
             "", f"machine: {report['machine']}", "",
             "| method | tokens/s | vs target-only (same run) | prompts identical to target-only |", "|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['tokens_per_second']:.2f} | "
              f"{r['vs_target_only']:.2f}x | {r['prompts_identical']}/{len(prompts)} |" for r in rows]
    lines += ["", "A bf16 target's greedy output can differ from bf16 target-only at near-ties (a verify forward's kernel "
              "shape; README, Limits); fp32 is the exactness reference (the tests)."]
    lines += ["", f"auto rule: {json.dumps(record)}"]
    write_job_report(out, report, lines)


if __name__ == "__main__":
    main()
