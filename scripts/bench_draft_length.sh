#!/usr/bin/env bash
# README draft-length table (pair G, k at 95% coverage, L = 5, 8, 12; ~25 min on 2 cores).
source "$(dirname "$0")/_common.sh"
out="docs/bench-gemma-draft-length-$DATE.md"
: > "$out"
for L in 5 8 12; do
    hf-vocabspec bench --target offline:gemma-3-270m --coverages 0.95 --context-tokens --workloads offline:sharegpt \
        --modes greedy t1 --prompts 3 --max-new-tokens 64 --repeats 2 --num-draft-tokens "$L" \
        --output "results/bench-gemma-L$L"
    { echo "## L = $L"; echo; cat "results/bench-gemma-L$L/results.md"; echo; } >> "$out"
done
