"""The drafter body's lean forward (hf_vocabspec.lean_forward) on and off, over a job of N prompts.

One process, methods interleaved prompt by prompt (benchmark.compare_methods, one pass): target-only with the same
fast linears, the default drafter (``trim_drafter`` at --coverage, no tune, eager steps) as generate runs it (its
body through the lean forward), and the same drafter with ``use_lean_forward = False`` (the body's own forward).
Reports each method's seconds against target-only, its mean draft step (stats.draft_seconds / draft_steps), and
whether the drafters' outputs agree (the lean forward is bitwise the body's own: they must). Prints a markdown table
naming the machine and writes results.json / results.md under --output.

Smallest check: python scripts/bench_lean_forward.py --prompts 2 --max-new-tokens 4 --count-examples 200 \
    --output /tmp/bench-lean-forward
"""

from __future__ import annotations

from hf_vocabspec import lean_forward
from hf_vocabspec.evaluation.benchmark import drafter_switch_job


def main() -> None:
    drafter_switch_job(__doc__.splitlines()[0].rstrip("."), switch="use_lean_forward", on="lean forward",
                       off="own forward", prompts=16, output="results/bench-lean-forward",
                       extra=lambda drafter: {"lean_forward_served": lean_forward.served(drafter.model)})


if __name__ == "__main__":
    main()
