"""Verify(L+1)/decode latency ratio of a target with its own LM head and with hf_vocabspec's verify head.

Both variants are measured in ONE process, alternating repeat by repeat, so they see the same load.
Usage: python scripts/verify_head.py [--model offline:gemma-3-270m] [--rows 6] [--repeats 15] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch

from hf_vocabspec.evaluation.offline import load_model
from hf_vocabspec.verify_head import kernel_choices, measure_verify_latency


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="offline:gemma-3-270m")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--rows", type=int, nargs="+", default=[6], help="verify widths L+1")
    ap.add_argument("--context", type=int, default=256, help="tokens already in the KV cache")
    ap.add_argument("--repeats", type=int, default=15, help="timed forwards per width and round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds alternating original head / verify head")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_model(args.model, dtype=getattr(torch, args.dtype)).eval()
    print(f"model {args.model} {args.dtype}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"context {args.context}, load before {os.getloadavg()}")
    runs = {False: [], True: []}
    for _ in range(args.rounds):
        for on in (False, True):
            runs[on].append(measure_verify_latency(target, tuple(args.rows), args.context, args.repeats,
                                                   use_verify_head=on))
    for on, label in ((False, "original head"), (True, "verify head")):
        for n in args.rows:
            ratios = [r for run in runs[on] for r in run.paired_ratios[n]]
            decode = [t for run in runs[on] for t in run.ms[1]]
            verify = [t for run in runs[on] for t in run.ms[n]]
            q = statistics.quantiles(ratios, n=4)
            print(f"{label:14s} rows {n:2d}: verify {statistics.median(verify):7.1f} ms, decode "
                  f"{statistics.median(decode):7.1f} ms, verify/decode median {statistics.median(ratios):.2f} "
                  f"(IQR {q[0]:.2f}-{q[2]:.2f}, min {min(ratios):.2f}, max {max(ratios):.2f}, n={len(ratios)}), "
                  f"kernel {runs[on][0].kernels[n]}")
    for c in kernel_choices():
        meds = {k: round(statistics.median(v), 1) for k, v in c.timings_ms.items() if v}
        print(f"head trials {c.key.out_features}x{c.key.in_features} {c.key.dtype} rows {c.key.rows} "
              f"threads {c.key.threads}: median ms {meds} -> {c.chosen}")
    print(f"load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
