#!/usr/bin/env bash
# README "Measured results", pair S table + docs/smollm2_throughput_vs_vocab.png (~12 min on 2 cores).
source "$(dirname "$0")/_common.sh"
hf-vocabspec bench --target offline:smollm2-135m-instruct --coverages 0.9 0.99 --context-tokens \
    --modes greedy t0.7 t1 --prompts 3 --max-new-tokens 64 --repeats 2 --output results/bench-smollm2
cp results/bench-smollm2/results.md "docs/bench-smollm2-$DATE.md"
cp results/bench-smollm2/results.json "docs/bench-smollm2-$DATE.json"
cp results/bench-smollm2/throughput_vs_vocab.png docs/smollm2_throughput_vs_vocab.png
