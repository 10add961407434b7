"""Inductor on this CPU against the eager fast linears (issue #36): is a compiled decode step worth turning on?

Target-only greedy decoding of one model (a drafter's shape: its step is what a round repeats L times), three
ways, each token-identical to the first (checked):
- eager ``F.linear`` (what a user runs),
- eager with our fast linears (``hf_vocabspec.kernels.fast_linears``: what our generate runs on CPU),
- transformers' static cache + ``torch.compile`` (Inductor; ``CompileConfig`` with ``_compile_all_devices``, as
  target-only compiles on CUDA), after one warm-up call that pays the compile.
Timed runs alternate the three; median ms per token (range) over ``--repeats``. Prints a markdown table naming the
machine.

    .venv/bin/python scripts/bench_cpu_compile.py --model <path of qwen2.5-coder-0.5b-instruct> --new-tokens 32
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers as T

from hf_vocabspec import kernels
from hf_vocabspec.evaluation.benchmark import machine_info

PROMPT = 'def quicksort(items):\n    """Sort a list."""\n'


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a local model folder (with its tokenizer)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = T.AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).eval()
    ids = T.AutoTokenizer.from_pretrained(args.model)(PROMPT, return_tensors="pt").input_ids
    kw = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
              pad_token_id=model.generation_config.pad_token_id or 0)
    config = T.CompileConfig()
    config._compile_all_devices = True

    def eager():
        return model.generate(ids, **kw)

    def fast():
        with kernels.fast_linears(model):
            return model.generate(ids, **kw)

    def compiled():
        return model.generate(ids, cache_implementation="static", compile_config=config, **kw)

    ways = {"eager `F.linear`": eager, "eager fast linears": fast, "static cache + torch.compile (Inductor)": compiled}
    t0 = time.perf_counter()
    ref = compiled()
    warm = time.perf_counter() - t0
    for name, fn in ways.items():
        if not torch.equal(fn(), ref):  # (also each way's warm-up)
            raise SystemExit(f"{name}: output differs from the compiled run")
    ms = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, fn in ways.items():
            t0 = time.perf_counter()
            fn()
            ms[name].append(1e3 * (time.perf_counter() - t0) / args.new_tokens)
    info = machine_info()
    print(f"Decode step, {args.model.rstrip('/').split('/')[-1]} {args.dtype}, {args.new_tokens} new tokens, greedy, "
          f"{args.repeats} alternating repeats (median (min-max)); {info['cpu']}, {info['torch_threads']} torch "
          f"threads, torch {info['torch']}, transformers {info['transformers']}, {info['date']}; compile warm-up "
          f"{warm:.0f} s; the three outputs identical\n")
    base = statistics.median(ms["eager `F.linear`"])
    print("| decode | ms / token | vs eager `F.linear` |")
    print("|---|---|---|")
    for name, values in ms.items():
        med = statistics.median(values)
        print(f"| {name} | {med:.1f} ({min(values):.1f}-{max(values):.1f}) | {base / med:.2f}x |")


if __name__ == "__main__":
    main()
