"""A drafter whose body is the target's taking the target's prompt cache, against it reading the prompt itself.

A drafter trimmed from the target itself (pair G) takes the target's prompt cache by default (the target's own first
step, then the drafter's cache a copy of the target's: generation/engine.py ``_take_prompt``);
``drafter.share_prompt_cache = False`` has it read the prompt itself, in its first round.

One process, methods interleaved prompt by prompt (benchmark.compare_methods, one pass): target-only with the same
fast linears, the default drafter (``trim_drafter`` at --coverage, no tune; the auto dtype) as generate runs it, and
the same drafter reading the prompt. Reports each method's seconds against target-only, its mean draft step and how
many prompts' outputs equal the first drafter's (the target's output: greedy and exact, so both must). Prints a
markdown table naming the machine and writes results.json / results.md under --output.

Smallest check: python scripts/bench_shared_prompt.py --prompts 2 --max-new-tokens 4 --count-examples 200 \
    --output /tmp/bench-shared-prompt
"""

from __future__ import annotations

from hf_vocabspec.evaluation.benchmark import drafter_switch_job


def main() -> None:
    drafter_switch_job(__doc__.splitlines()[0].rstrip("."), switch="share_prompt_cache", on="prompt cache taken",
                       off="prompt read by the drafter", prompts=8, output="results/bench-shared-prompt")


if __name__ == "__main__":
    main()
