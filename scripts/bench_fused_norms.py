"""The drafter's fused norms (hf_vocabspec.kernels, ``_NORM_STYLES``) on and off, over a job of N prompts.

Pair G by default (Gemma-3-270M drafting for itself): target-only with the fast linears, the default drafter
(``trim_drafter`` at --coverage, no tune, eager steps) as generate runs it (norms fused), and the same drafter with
its norms left to their modules (the registry emptied for that method's calls, restored after). Methods run
interleaved prompt by prompt (the order flipped every other prompt); the first prompt is a warm-up. Prints a
markdown table naming the machine and writes results.json / results.md under --output.

    .venv/bin/python scripts/bench_fused_norms.py --prompts 16
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

from hf_vocabspec import kernels
from hf_vocabspec.evaluation.benchmark import (default_drafter_job, default_drafter_job_args, machine_info,
                                               write_job_report)


@contextmanager
def norms_unfused():
    saved = dict(kernels._NORM_STYLES)
    kernels._NORM_STYLES.clear()
    try:
        yield
    finally:
        kernels._NORM_STYLES.update(saved)


def main() -> None:
    args = default_drafter_job_args(__doc__.splitlines()[0], prompts=16, output="results/bench-fused-norms")
    out = Path(args.output)
    job = default_drafter_job(args)
    target, drafter, k, dtype, prompts = job.target, job.drafter, job.kept_vocab, job.dtype, job.prompts
    names = ["target only (fast linears)", "default drafter (norms fused)", "default drafter (norms unfused)"]
    seconds = {n: [] for n in names}
    steps = {n: [] for n in names[1:]}
    outputs = {n: [] for n in names}
    kernels_line = ""
    for i, p in enumerate(prompts):
        ids = p if p.dim() == 2 else p[None]
        kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                  do_sample=False)
        for name in (names if i % 2 == 0 else names[::-1]):
            if name == names[0]:
                with kernels.fast_linears(target):
                    t = time.perf_counter()
                    o = target.generate(**kw)
                    dt = time.perf_counter() - t
            else:
                with norms_unfused() if name == names[2] else nullcontext():
                    t = time.perf_counter()
                    o = target.generate(assistant_model=drafter, **kw)
                    dt = time.perf_counter() - t
                st = drafter.last_speculation_stats
                if i:
                    steps[name].append(st.draft_seconds / max(1, st.draft_steps))
                if name == names[1]:
                    kernels_line = st.kernels
            if i:  # the first prompt warms every method up
                seconds[name].append(dt)
                outputs[name].append(o[0, ids.shape[1]:].tolist())
    base = sum(seconds[names[0]])
    rows = [{"method": n, "seconds": sum(seconds[n]), "vs_target_only": base / sum(seconds[n]),
             "draft_ms_per_step": 1e3 * statistics.median(steps[n]) if n in steps else None,
             "prompts_identical_to_norms_fused": sum(a == b for a, b in zip(outputs[n], outputs[names[1]]))}
            for n in names]
    info = machine_info()
    report = {"config": vars(args) | {"kept_vocab": k, "dtype": str(dtype)}, "machine": info, "rows": rows,
              "kernels": kernels_line}
    lines = [f"# The drafter's fused norms on and off: {len(prompts) - 1} prompts x {args.max_new_tokens} new tokens "
             f"(+1 warm-up), {args.target}, k = {k}, {dtype}", "", f"machine: {info}", "",
             "| method | seconds | vs target-only (same run) | draft ms / step (median) | prompts identical to norms fused |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['seconds']:.1f} | {r['vs_target_only']:.3f}x | "
              f"{'-' if r['draft_ms_per_step'] is None else format(r['draft_ms_per_step'], '.1f')} | "
              f"{r['prompts_identical_to_norms_fused']}/{len(prompts) - 1} |" for r in rows]
    lines += ["", f"stats.kernels (norms fused): {kernels_line}"]
    write_job_report(out, report, lines)


if __name__ == "__main__":
    main()
