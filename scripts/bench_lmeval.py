"""lm-eval's ``hf`` backend against ``hf-vocabspec`` on the offline HumanEval task, side by side in one run.

For each pair (G: Gemma-3-270M fp32 target with its trimmed bf16 copy; Q: Qwen2.5-Coder-1.5B fp32 target with the
trimmed 0.5B drafter, ``make setup-pair``) and each batch size, both backends run ``lm_eval.simple_evaluate`` on
the same loaded models (construction not timed), interleaved; wall time covers lm-eval's whole evaluate call
(tokenising, batching, generate, post-processing), tokens are the returned continuations' tokens (identical
outputs give both backends the same count). Prints a markdown table naming the machine; --output writes it and
results.json there.

Smoke run: python scripts/bench_lmeval.py --pairs g --limit 2 --max-gen-toks 8 --batch-sizes 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import torch

from hf_vocabspec import trim_drafter
from hf_vocabspec.coverage import count_assistant_tokens
from hf_vocabspec.kernels import native_bf16
from hf_vocabspec.evaluation.lmeval import TASKS_DIR, VocabSpecLM
from hf_vocabspec.evaluation.offline import load_chat_dataset, load_model, load_tokenizer

PAIRS = {  # as `hf-vocabspec demo --pair`: the drafter defaults to a bf16 copy of the target
    "g": ("offline:gemma-3-270m", None),
    "q": ("offline:qwen2.5-coder-1.5b-instruct", "offline:qwen2.5-coder-0.5b-instruct"),
}


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return "unknown CPU"


def build_drafter(target: str, base: str | None, dtype: torch.dtype, coverage: float, count_examples: int):
    """The trimmed drafter of a pair: the top tokens of ShareGPT assistant text covering ``coverage``."""
    tokenizer = load_tokenizer(target)
    counts = count_assistant_tokens(load_chat_dataset("offline:sharegpt"), tokenizer, max_examples=count_examples)
    keep = counts.top_k(counts.smallest_k_for_coverage(coverage))
    return trim_drafter(load_model(base or target, dtype=dtype), keep, tokenizer=tokenizer, target_model=target).eval()


def timed_run(lm, task_manager, task: str, limit: int, max_gen_toks: int, tokenizer) -> dict:
    import lm_eval

    start = time.perf_counter()
    res = lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=task_manager, limit=limit, log_samples=True,
                                  gen_kwargs=f"max_gen_toks={max_gen_toks}", bootstrap_iters=0)
    wall = time.perf_counter() - start
    resps = {s["doc_id"]: s["resps"][0][0] for s in res["samples"][task]}
    tokens = sum(len(tokenizer(r, add_special_tokens=False).input_ids) for r in resps.values())
    return {"wall_s": wall, "tokens": tokens, "tok_s": tokens / wall if wall else 0.0, "resps": resps,
            "speculation": res["config"].get("speculation")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", nargs="+", choices=sorted(PAIRS), default=["g", "q"])
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4])
    p.add_argument("--task", default="vocabspec_humaneval")
    p.add_argument("--limit", type=int, default=8, help="HumanEval problems per run")
    p.add_argument("--max-gen-toks", type=int, default=128)
    p.add_argument("--coverage", type=float, default=0.95)
    p.add_argument("--count-examples", type=int, default=2000)
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()

    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    task_manager = TaskManager(include_path=str(TASKS_DIR))
    rows, report = [], {"machine": cpu_name(), "date": time.strftime("%Y-%m-%d"), "torch_threads":
                        torch.get_num_threads(), "task": args.task, "limit": args.limit,
                        "max_gen_toks": args.max_gen_toks, "runs": []}
    for pair in args.pairs:
        target_name, base = PAIRS[pair]
        drafter_dtype = torch.bfloat16 if pair == "g" or native_bf16() else torch.float32
        tokenizer = load_tokenizer(target_name)
        target = load_model(target_name, dtype=torch.float32).eval()
        drafter = build_drafter(target_name, base, drafter_dtype, args.coverage, args.count_examples)
        for bs in args.batch_sizes:
            runs = {}
            for backend in ("hf", "hf-vocabspec"):
                try:
                    lm = (HFLM(pretrained=target, tokenizer=tokenizer, batch_size=bs) if backend == "hf" else
                          VocabSpecLM(pretrained=target, tokenizer=tokenizer, drafter=drafter, batch_size=bs))
                    runs[backend] = timed_run(lm, task_manager, args.task, args.limit, args.max_gen_toks, tokenizer)
                except Exception as err:  # noqa: BLE001 - reported in the table (e.g. batch > 1 before issue 27)
                    runs[backend] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"}
            hf, ours = runs["hf"], runs["hf-vocabspec"]
            same = None if "error" in hf or "error" in ours else hf["resps"] == ours["resps"]
            for backend, r in runs.items():
                report["runs"].append({"pair": pair, "batch_size": bs, "backend": backend, "identical_to_hf": same,
                                       **{k: v for k, v in r.items() if k != "resps"}})
                if "error" in r:
                    rows.append(f"| {pair.upper()} | {bs} | {backend} | failed: {r['error']} | | | | |")
                    continue
                speed = r["tok_s"] / hf["tok_s"] if "error" not in hf and hf["tok_s"] else None
                tau = (r.get("speculation") or {}).get("tau")
                rows.append(f"| {pair.upper()} | {bs} | {backend} | {r['wall_s']:.1f} | {r['tokens']} | "
                            f"{r['tok_s']:.1f} | {f'{speed:.2f}x' if speed else '-'} | "
                            f"{'-' if same is None else 'yes' if same else 'NO'} | {f'{tau:.2f}' if tau else '-'} |")
        del target, drafter
    header = (f"lm-eval {args.task}, limit {args.limit}, max_gen_toks {args.max_gen_toks}, greedy; "
              f"{report['machine']}, {report['torch_threads']} torch threads, {report['date']}\n\n"
              "| pair | batch | backend | wall s | tokens | tok/s | vs hf | identical | tau |\n"
              "|---|---:|---|---:|---:|---:|---:|---|---:|")
    table = header + "\n" + "\n".join(rows)
    print(table)
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "results.md").write_text(table + "\n")
        (args.output / "results.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
