#!/usr/bin/env bash
# Pair G tokens/s by draft length L = 5, 8, 12 at k for 95% coverage (docs/results/throughput-vs-draft-length-gemma-DATE.md;
# ~25 min on 2 cores).
source "$(dirname "$0")/_common.sh"
out="results/throughput-vs-draft-length-gemma.md"
: > "$out"
for L in 5 8 12; do
    hf-vocabspec bench --target offline:gemma-3-270m --coverages 0.95 --context-tokens --workloads offline:sharegpt \
        --modes greedy t1 --prompts 3 --max-new-tokens 64 --repeats 2 --num-draft-tokens "$L" \
        --output "results/bench-gemma-L$L"
    { echo "## L = $L"; echo; cat "results/bench-gemma-L$L/results.md"; echo; } >> "$out"
done
publish "$out" "throughput-vs-draft-length-gemma-$DATE.md"
