#!/usr/bin/env bash
# Pair S tokens/s (docs/results/throughput-smollm2-DATE.{md,json} and its plot; ~12 min on 2 cores).
source "$(dirname "$0")/_common.sh"
hf-vocabspec bench --target offline:smollm2-135m-instruct --coverages 0.9 0.99 --context-tokens \
    --modes greedy t0.7 t1 --prompts 3 --max-new-tokens 64 --repeats 2 --output results/bench-smollm2
publish results/bench-smollm2/results.md "throughput-smollm2-$DATE.md"
publish results/bench-smollm2/results.json "throughput-smollm2-$DATE.json"
publish results/bench-smollm2/throughput_vs_vocab.png "throughput-vs-kept-size-smollm2-$DATE.png"
