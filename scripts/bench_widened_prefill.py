"""A bf16 drafter's prefill widened to float32 (kernels.PREFILL_CANDIDATES) on and off, over a job of N prompts.

Two parts, one process, nothing else running:

1. The drafter's prefill alone: the default drafter's body (``trim_drafter`` at --coverage, no tune) runs forwards of
   each of --lengths positions inside the fast linears, as generate enters them, with ``widen`` on and off,
   alternating, --repeats times (after one untimed forward each, which makes the kernel choices); median and range.
2. The job (``benchmark.drafter_switch_job``'s table, methods interleaved prompt by prompt): target-only with the
   same fast linears, the default drafter as generate runs it, and the same drafter with
   ``use_widened_prefill = False``.

Prints markdown tables naming the machine and writes results.json / results.md (the job) and prefill.json under
--output. Smallest check: python scripts/bench_widened_prefill.py --prompts 1 --max-new-tokens 4 \
    --count-examples 200 --lengths 80 --repeats 1 --output /tmp/bench-widened-prefill
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from hf_vocabspec import kernels
from hf_vocabspec.evaluation.benchmark import (default_drafter_job, default_drafter_job_args, drafter_switch_job,
                                               machine_info)
from hf_vocabspec.modeling import model_body


def prefill_table(argv: list[str]) -> list[str]:
    """Part 1 (its own options: --lengths, --repeats); returns the job's options."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--lengths", type=int, nargs="+", default=[100, 250, 500], help="prefill positions timed")
    ap.add_argument("--repeats", type=int, default=5, help="alternating timed forwards per length and setting")
    mine, rest = ap.parse_known_args(argv)
    lengths, repeats = mine.lengths, mine.repeats
    sys.argv[1:] = rest
    args = default_drafter_job_args("prefill", prompts=16, output="results/bench-widened-prefill")
    job = default_drafter_job(args)
    body = model_body(job.drafter)
    vocab = body.get_input_embeddings().weight.shape[0]
    rows, info = [], machine_info()
    with torch.no_grad():
        for n in lengths:
            ids = (torch.arange(n)[None] * 7919 + 13) % vocab
            times = {"widened": [], "bf16": []}
            for r in range(repeats + 1):
                for name, widen in (("widened", True), ("bf16", False)):
                    with kernels.fast_linears(draft=(body,), widen=widen):
                        t0 = time.perf_counter()
                        body(input_ids=ids, use_cache=False)
                        if r:  # (the first forward of each makes its kernel choices)
                            times[name].append(time.perf_counter() - t0)
            rows.append({"positions": n, **{f"{k}_s": v for k, v in times.items()}})
    Path(args.output).mkdir(parents=True, exist_ok=True)
    (Path(args.output) / "prefill.json").write_text(json.dumps({"machine": info, "drafter": args.drafter,
                                                                "dtype": str(job.dtype), "rows": rows}, indent=2))
    lines = [f"# The default drafter's prefill ({args.drafter}, k = {job.kept_vocab}, {job.dtype}), widened to float32 "
             f"or bf16, {repeats} alternating repeats", "", f"machine: {info}", "",
             "| positions | widened s (median, range) | bf16 s (median, range) | bf16 / widened |", "|---|---|---|---|"]
    for r in rows:
        w, b = statistics.median(r["widened_s"]), statistics.median(r["bf16_s"])
        lines.append(f"| {r['positions']} | {w:.3f} ({min(r['widened_s']):.3f}-{max(r['widened_s']):.3f}) | "
                     f"{b:.3f} ({min(r['bf16_s']):.3f}-{max(r['bf16_s']):.3f}) | {b / w:.2f}x |")
    print("\n".join(lines))
    return rest


def main() -> None:
    argv = sys.argv[1:]
    rest = prefill_table(argv)
    sys.argv[1:] = rest
    drafter_switch_job(__doc__.splitlines()[0].rstrip("."), switch="use_widened_prefill", on="widened prefill",
                       off="bf16 prefill", prompts=16, output="results/bench-widened-prefill")


if __name__ == "__main__":
    main()
