"""The drafter's fused norms (hf_vocabspec.kernels, ``_NORM_STYLES``) on and off, over a job of N prompts.

One process, methods interleaved prompt by prompt (benchmark.compare_methods, one pass): target-only with the same
fast linears, the default drafter (``trim_drafter`` at --coverage, no tune, eager steps) as generate runs it (norms
fused), and the same drafter with ``use_fused_norms = False`` (its norms left to their modules). Reports each
method's seconds against target-only, its mean draft step (stats.draft_seconds / draft_steps), and whether the
drafters' outputs agree. Prints a markdown table naming the machine and writes results.json / results.md under
--output.

Smallest check: python scripts/bench_fused_norms.py --prompts 2 --max-new-tokens 4 --count-examples 200 \
    --output /tmp/bench-fused-norms
"""

from __future__ import annotations

from pathlib import Path

from hf_vocabspec.evaluation.benchmark import (Method, compare_methods, default_drafter_job, default_drafter_job_args,
                                               job_rows, machine_info, write_job_report)


def main() -> None:
    args = default_drafter_job_args(__doc__.splitlines()[0], prompts=16, output="results/bench-fused-norms")
    job = default_drafter_job(args)
    target, drafter, prompts = job.target, job.drafter, job.prompts
    methods = [Method("target only (fast linears)", fast_linears=True),
               Method("default drafter (norms fused)", drafter),
               Method("default drafter (norms unfused)", drafter, attrs={"use_fused_norms": False})]
    res = compare_methods(target, methods, prompts, max_new_tokens=args.max_new_tokens, repeats=1,
                          generate_kwargs={"do_sample": False})
    rows = job_rows(res, methods, reference=methods[1].name)
    info = machine_info()
    report = {"config": vars(args) | {"kept_vocab": job.kept_vocab, "dtype": str(job.dtype)}, "machine": info,
              "rows": rows}
    lines = [f"# The drafter's fused norms on and off: {len(prompts)} prompts x {args.max_new_tokens} new tokens, "
             f"{args.target}, k = {job.kept_vocab}, {job.dtype}", "", f"machine: {info}", "",
             "| method | seconds | vs target-only (same run) | draft ms / step | prompts identical to norms fused |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['seconds']:.1f} | {r['vs_target_only']:.3f}x | "
              f"{'-' if r['draft_ms_per_step'] is None else format(r['draft_ms_per_step'], '.1f')} | "
              f"{r['prompts_identical']}/{len(prompts)} |" for r in rows]
    lines += ["", f"stats.kernels (norms fused): {rows[1]['kernels']}",
              f"stats.kernels (norms unfused): {rows[2]['kernels']}"]
    write_job_report(Path(args.output), report, lines)


if __name__ == "__main__":
    main()
