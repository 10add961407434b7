#!/usr/bin/env bash
# README table "Batched speculative decoding" (pair G, greedy): batch sizes 1, 2, 4, 8 (~25 min on 2 cores).
source "$(dirname "$0")/_common.sh"
.venv/bin/hf-vocabspec bench --target offline:gemma-3-270m --coverages 0.95 --batch-sizes 1 2 4 8 \
    --max-new-tokens 48 --repeats 2 --output results/batched "$@"
