"""The engine's loop under torch.inference_mode against generate's no_grad, over a job of N prompts.

Inference mode is the default where the target's cache is dynamic and nothing is compiled
(generation.hooks.runs_in_inference_mode); ``drafter.use_inference_mode = False`` keeps no_grad.

One process, methods interleaved prompt by prompt (benchmark.compare_methods, one pass): target-only with the same
fast linears, the default drafter (``trim_drafter`` at --coverage, no tune; float32 where the CPU has no native
bf16) as generate runs it, and the same drafter with ``use_inference_mode = False``. Reports each method's seconds
against target-only, its mean draft step and how many prompts' outputs equal the first drafter's (the target's
output: greedy and exact, so both must). Prints a markdown table naming the machine and writes results.json /
results.md under --output.

Smallest check: python scripts/bench_inference_mode.py --prompts 2 --max-new-tokens 4 --count-examples 200 \
    --output /tmp/bench-inference-mode
"""

from __future__ import annotations

from hf_vocabspec.evaluation.benchmark import drafter_switch_job


def main() -> None:
    drafter_switch_job(__doc__.splitlines()[0].rstrip("."), switch="use_inference_mode", on="inference mode",
                       off="no_grad", prompts=8, output="results/bench-inference-mode")


if __name__ == "__main__":
    main()
