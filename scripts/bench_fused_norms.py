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

from hf_vocabspec.evaluation.benchmark import drafter_switch_job


def main() -> None:
    drafter_switch_job(__doc__.splitlines()[0].rstrip("."), switch="use_fused_norms", on="norms fused",
                       off="norms unfused", prompts=16, output="results/bench-fused-norms")


if __name__ == "__main__":
    main()
