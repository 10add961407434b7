"""The drafter's int8 copies (kernels.DRAFT_CANDIDATES: "int8", and "int8_bf16" for a float32 drafter) on and off,
over a job of N prompts.

One process, methods interleaved prompt by prompt (benchmark.compare_methods, one pass): target-only with the same
fast linears, the default drafter (``trim_drafter`` at --coverage, no tune; float32 where the CPU has no native
bf16) as generate runs it (its draft steps' layers trial their int8 copies), and the same drafter with
``use_int8_copies = False``. Reports each method's seconds against target-only, its mean draft step, how many
prompts' outputs equal the first drafter's (the target's output: both must, they are greedy and exact) and the
kernels the drafter's layers kept for one-row steps. Prints a markdown table naming the machine and writes
results.json / results.md under --output.

Smallest check: python scripts/bench_int8_copies.py --prompts 2 --max-new-tokens 4 --count-examples 200 \
    --output /tmp/bench-int8-copies
"""

from __future__ import annotations

from collections import Counter

from torch import nn

from hf_vocabspec import kernels
from hf_vocabspec.evaluation.benchmark import drafter_switch_job


def kept_for_steps(drafter) -> dict:
    """The kernels the drafter's layer shapes kept for one-row draft steps (a count per kernel)."""
    ours = {(str(m.weight.dtype).removeprefix("torch."), *m.weight.shape)
            for m in drafter.modules() if type(m) is nn.Linear}
    kept = Counter(c.chosen for c in kernels.choices() if c.key.draft and c.key.rows == 1
                   and (c.key.dtype, c.key.out_features, c.key.in_features) in ours)
    return {"kernels_kept_for_one_row_steps": dict(kept)}


def main() -> None:
    drafter_switch_job(__doc__.splitlines()[0].rstrip("."), switch="use_int8_copies", on="int8 copies",
                       off="no int8 copies", prompts=8, output="results/bench-int8-copies", extra=kept_for_steps)


if __name__ == "__main__":
    main()
