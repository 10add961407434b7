"""Batch-1 speed of the speculative engine against transformers' own assisted loop (the path before the engine:
our candidate generator inside ``_assisted_decoding``), same trimmed drafter, same prompts, greedy.

Methods interleaved prompt by prompt, repeated; the first repeat warms up and is dropped. Prints a markdown table
(tokens/s median and range, engine / transformers-loop ratio per repeat) naming the machine, and checks that
both outputs equal target-only generate.

    .venv/bin/python scripts/bench_engine_batch1.py                      # pair G (Gemma-3-270M, bf16 drafter)
    .venv/bin/python scripts/bench_engine_batch1.py --prompts 6 --max-new-tokens 64 --repeats 3
    .venv/bin/python scripts/bench_engine_batch1.py --device cuda         # where a GPU is lent
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hf_vocabspec.configuration import set_draft_length
from hf_vocabspec.trimming import trim_drafter
from hf_vocabspec.evaluation.benchmark import machine_info
from hf_vocabspec.evaluation.data import eval_prompts, load_workload
from hf_vocabspec.evaluation.offline import load_model
from hf_vocabspec.generation.hooks import transformers_loop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="offline:gemma-3-270m")
    ap.add_argument("--drafter-dtype", default="bfloat16")
    ap.add_argument("--coverage", type=float, default=0.95)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--draft-length", type=int, default=None, help="default: the trimmed drafter's own")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    work = load_workload(args.target, "offline:sharegpt", 4000, progress=False)
    tokenizer, target = work.tokenizer, work.target.to(args.device)
    k = work.counts.smallest_k_for_coverage(args.coverage)
    drafter = trim_drafter(load_model(args.target, dtype=getattr(torch, args.drafter_dtype)), work.counts.top_k(k),
                           tokenizer=tokenizer).eval().to(args.device)
    if args.draft_length:
        set_draft_length(drafter.generation_config, args.draft_length)
    prompts = [p.to(args.device) for p in eval_prompts(work.held_out, tokenizer, 0, args.prompts, 512, 32)]
    gen = dict(do_sample=False, max_new_tokens=args.max_new_tokens)

    def engine(p):
        return target.generate(p, attention_mask=torch.ones_like(p), assistant_model=drafter, **gen)

    def hf_loop(p):
        with transformers_loop():
            return target.generate(p, attention_mask=torch.ones_like(p), assistant_model=drafter, **gen)

    methods = {"engine": engine, "transformers' loop": hf_loop}
    times = {m: [] for m in methods}
    tokens = {m: [] for m in methods}
    identical = {m: True for m in methods}
    refs = [target.generate(p, attention_mask=torch.ones_like(p), **gen) for p in prompts]
    with torch.no_grad():
        for rep in range(args.repeats + 1):
            spent = {m: 0.0 for m in methods}
            made = {m: 0 for m in methods}
            for p, ref in zip(prompts, refs):
                for name, fn in methods.items():
                    t0 = time.perf_counter()
                    out = fn(p)
                    spent[name] += time.perf_counter() - t0
                    made[name] += out.shape[1] - p.shape[1]
                    identical[name] &= torch.equal(out, ref)
            if rep:  # the first repeat warms up
                for m in methods:
                    times[m].append(spent[m])
                    tokens[m].append(made[m])
    info = machine_info()
    print(f"Machine: {info['cpu']} ({info['torch_threads']} torch threads, AVX-512 BF16: {info['native_bf16']}), "
          f"torch {info['torch']}, transformers {info['transformers']}, {info['date']}, "
          f"device {args.device}; target {args.target}, drafter {args.drafter_dtype} k={k}, "
          f"L={drafter.generation_config.num_assistant_tokens}, {args.prompts} prompts x {args.max_new_tokens} "
          f"new tokens, {args.repeats} repeats")
    print("| method | tokens/s median (range) | vs transformers' loop (median, range) | identical to target-only |")
    print("|---|---|---|---|")
    base = [t / s for t, s in zip(tokens["transformers' loop"], times["transformers' loop"])]
    for m in methods:
        tps = [t / s for t, s in zip(tokens[m], times[m])]
        ratios = [a / b for a, b in zip(tps, base)]
        print(f"| {m} | {statistics.median(tps):.2f} ({min(tps):.2f}-{max(tps):.2f}) | "
              f"{statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f}) | {identical[m]} |")


if __name__ == "__main__":
    main()
