#!/usr/bin/env bash
# Joint tuning of (k, L, context tokens) on pair G with an fp32 trimmed drafter, validated next to its neighbours
# (docs/results/tune-gemma-DATE.md and tune-heatmap-gemma-DATE.png).
source "$(dirname "$0")/_common.sh"
hf-vocabspec tune --target offline:gemma-3-270m --drafter-dtype float32 --mode greedy --conversations 12 \
    --coverages 0.9 0.95 0.99 --draft-lengths 3 5 8 12 --repeats 5 --validate 2 --max-new-tokens 48 \
    --output results/tune-gemma | tee results/tune-gemma.log
publish results/tune-gemma.log "tune-gemma-$DATE.md"
publish results/tune-gemma/heatmap.png "tune-heatmap-gemma-$DATE.png"
