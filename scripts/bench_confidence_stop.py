"""The adapted confidence stop against the configured one, over a job of N prompts.

The stop adapts by default (rounds of one row on a CPU: generation/confidence.py); ``drafter.adapt_confidence_threshold
= False`` keeps the configured threshold (0.4 for a freshly trimmed drafter).

One process, methods interleaved prompt by prompt (benchmark.compare_methods, one pass): target-only with the same
fast linears, the default drafter (``trim_drafter`` at --coverage, no tune; float32 where the CPU has no native bf16)
as generate runs it (the stop adapted, learning from the job's first calls), and the same drafter with the configured
threshold. Reports each method's seconds against target-only, its mean draft step, how many prompts' outputs equal the
first drafter's (the target's output: greedy and exact, so both must), and the threshold the adapted stop ended at.
Prints a markdown table naming the machine and writes results.json / results.md under --output.

--warm: first one untimed pass of the adapted drafter over the job's prompts (what it learns is kept), so the table
shows the stop where it settled; without it the job's first calls also learn.

Pair Q: --target offline:qwen2.5-coder-1.5b-instruct --drafter offline:qwen2.5-coder-0.5b-instruct --prompts 3

Smallest check: python scripts/bench_confidence_stop.py --prompts 2 --max-new-tokens 4 --count-examples 200 \
    --output /tmp/bench-confidence-stop
"""

from __future__ import annotations

import sys

import torch

from hf_vocabspec.evaluation.benchmark import default_drafter_job, default_drafter_job_args, drafter_switch_job
from hf_vocabspec.generation import engine


def adapted(drafter) -> dict:
    """Where the adapted stop ended, per configured threshold, and what it had seen."""
    models = engine.stop_models(drafter)
    return {"adapted threshold": {f"from {setting[-1]:g}": {"now": model.threshold,
                                                           "judged drafts": round(model.judged_drafts),
                                                           "timed rounds": len(model.timed)}
                                  for setting, model in models.items()}}


def main() -> None:
    title = __doc__.splitlines()[0].rstrip(".")
    warm = "--warm" in sys.argv[1:]
    args = default_drafter_job_args(title, prompts=8, output="results/bench-confidence-stop",
                                    argv=[a for a in sys.argv[1:] if a != "--warm"])
    job = default_drafter_job(args)
    if warm:
        with torch.no_grad():
            for ids in job.prompts:
                job.target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=args.max_new_tokens, assistant_model=job.drafter)
    drafter_switch_job(title + (" (warm: after one untimed pass)" if warm else ""), switch="adapt_confidence_threshold",
                       on="adapted stop", off="configured stop", prompts=8, output=args.output, extra=adapted,
                       args=args, job=job)


if __name__ == "__main__":
    main()
