"""The drafter's fast prefill (kernels.PREFILL_CANDIDATES: w8a8, float32-widened) on and off, over a job of N prompts.

Two parts, one process, nothing else running:

1. The drafter's prefill alone: the default drafter's body (``trim_drafter`` at --coverage, no tune) runs forwards of
   each of --lengths positions inside the fast linears, as generate enters them, with each prefill kernel forced in
   turn (``F.linear`` in the drafter's dtype: ``prefill=False``; "float32"; "w8a8"), alternating, --repeats times
   after one untimed forward each (which makes the kernel choices); median and range.
   Then what the fast prefill changes: over the job's prompts longer than MAX_ROWS tokens, the share of prompt
   positions where the drafter's next-token choice (argmax of its draft-space logits, a whole forward) with each
   kernel forced equals the one with ``F.linear``.
2. The job (``benchmark.drafter_switch_job``'s table, methods interleaved prompt by prompt): target-only with the
   same fast linears, the default drafter as generate runs it (the trials choose its prefill kernels), and the same
   drafter with ``use_fast_prefill = False``.

Prints markdown tables naming the machine and writes results.json / results.md (the job) and prefill.json under
--output. Smallest check: python scripts/bench_fast_prefill.py --prompts 1 --max-new-tokens 4 \
    --count-examples 200 --lengths 80 --repeats 1 --output /tmp/bench-fast-prefill
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from hf_vocabspec import kernels
from hf_vocabspec.evaluation.benchmark import (default_drafter_job, default_drafter_job_args, drafter_switch_job,
                                               machine_info)
from hf_vocabspec.modeling import model_body

OUTPUT = "results/bench-fast-prefill"


@contextmanager
def forced(kernel: str | None):
    """Within the block, the drafter's prefill kernel is ``kernel`` (its trials keep it whatever its time; None: no
    fast prefill, ``F.linear``); the candidates, margin and choices are restored / forgotten on exit."""
    saved = kernels.PREFILL_CANDIDATES, kernels.MARGIN
    try:
        if kernel is not None:
            kernels.PREFILL_CANDIDATES, kernels.MARGIN = ("linear", kernel), float("inf")
        yield
    finally:
        kernels.PREFILL_CANDIDATES, kernels.MARGIN = saved
        kernels.forget_choices()


def forward_seconds(body, ids, kernel: str | None) -> float:
    """Seconds of a forward of ``ids`` through ``body`` in the fast linears with ``kernel`` forced, after one
    untimed forward (its trials)."""
    with forced(kernel), kernels.fast_linears(draft=(body,), prefill=kernel is not None):
        body(input_ids=ids, use_cache=False)
        t0 = time.perf_counter()
        body(input_ids=ids, use_cache=False)
        return time.perf_counter() - t0


def agreement(drafter, prompts, kernel: str) -> tuple[int, int]:
    """(positions whose argmax with ``kernel`` forced equals F.linear's, positions) over ``prompts``."""
    same = total = 0
    for ids in (p.reshape(1, -1) for p in prompts):
        with forced(None), kernels.fast_linears(draft=(drafter,), prefill=False):
            want = drafter(input_ids=ids, use_cache=False).logits.argmax(-1)
        with forced(kernel), kernels.fast_linears(draft=(drafter,)):
            for _ in range(2 * (kernels.TRIALS + 1)):  # (forwards until every layer's trials are over)
                drafter(input_ids=ids, use_cache=False)
                if all(c.chosen is not None for c in kernels.choices()):
                    break
            got = drafter(input_ids=ids, use_cache=False).logits.argmax(-1)
        same += int((got == want).sum())
        total += want.numel()
    return same, total


def prefill_table(args, job) -> None:
    """Part 1 on ``job`` (``args``: the job's options with --lengths, --repeats)."""
    body = model_body(job.drafter)
    vocab = body.get_input_embeddings().weight.shape[0]
    names = {None: f"F.linear ({str(job.dtype).removeprefix('torch.')})", "float32": "float32", "w8a8": "w8a8"}
    kinds = [k for k in names if k is None or k in kernels._prefill_candidates(job.dtype)]
    rows, info = [], machine_info()
    with torch.no_grad():
        for n in args.lengths:
            ids = (torch.arange(n)[None] * 7919 + 13) % vocab
            times = {names[k]: [] for k in kinds}
            for r in range(args.repeats + 1):
                for k in kinds:
                    seconds = forward_seconds(body, ids, k)
                    if r:
                        times[names[k]].append(seconds)
            rows.append({"positions": n, "seconds": times})
        long = [p for p in job.prompts if p.shape[-1] > kernels.MAX_ROWS]
        agree = {names[k]: agreement(job.drafter, long, k) for k in kinds if k}
    Path(args.output).mkdir(parents=True, exist_ok=True)
    (Path(args.output) / "prefill.json").write_text(json.dumps({"machine": info, "drafter": args.drafter,
                                                                "dtype": str(job.dtype), "rows": rows,
                                                                "argmax_agreement": agree}, indent=2))
    base = names[None]
    head = " | ".join(f"{names[k]} s (median, range)" for k in kinds)
    lines = [f"# The default drafter's prefill ({args.drafter}, k = {job.kept_vocab}, {job.dtype}), each prefill kernel "
             f"forced, {args.repeats} alternating repeats", "", f"machine: {info}", "",
             f"| positions | {head} | " + " | ".join(f"{base} / {names[k]}" for k in kinds if k) + " |",
             "|---|" + "---|" * (2 * len(kinds) - 1)]
    for r in rows:
        t = r["seconds"]
        cells = [f"{statistics.median(t[names[k]]):.3f} ({min(t[names[k]]):.3f}-{max(t[names[k]]):.3f})" for k in kinds]
        ratios = [f"{statistics.median(t[base]) / statistics.median(t[names[k]]):.2f}x" for k in kinds if k]
        lines.append(f"| {r['positions']} | " + " | ".join(cells + ratios) + " |")
    lines += ["", f"The drafter's next-token choice over {len(long)} prompts longer than {kernels.MAX_ROWS} tokens, "
              f"equal to {base}'s at: " + (", ".join(f"{k} {a / t:.2%} ({a}/{t} positions)" for k, (a, t) in agree.items())
                                           if long else "- (no such prompt in this job)")]
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--lengths", type=int, nargs="+", default=[100, 250, 500], help="prefill positions timed")
    ap.add_argument("--repeats", type=int, default=5, help="alternating timed forwards per length and kernel")
    description = __doc__.splitlines()[0].rstrip(".")
    args = default_drafter_job_args(description, prompts=16, output=OUTPUT, parents=(ap,))
    job = default_drafter_job(args)  # (loaded once: both parts run on it)
    prefill_table(args, job)
    drafter_switch_job(description, switch="use_fast_prefill", on="fast prefill", off="prefill in F.linear",
                       prompts=16, output=OUTPUT, args=args, job=job)


if __name__ == "__main__":
    main()
