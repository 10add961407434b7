#!/usr/bin/env bash
# README "Measured results", pair G table + docs/gemma_throughput_vs_vocab.png (~15 min on 2 cores).
source "$(dirname "$0")/_common.sh"
hf-vocabspec bench --target offline:gemma-3-270m --coverages 0.95 0.99 --context-tokens \
    --modes greedy t0.7 t1 --prompts 3 --max-new-tokens 64 --repeats 2 --output results/bench-gemma
cp results/bench-gemma/results.md "docs/bench-gemma-$DATE.md"
cp results/bench-gemma/results.json "docs/bench-gemma-$DATE.json"
cp results/bench-gemma/throughput_vs_vocab.png docs/gemma_throughput_vs_vocab.png
cp results/bench-gemma/draft_latency_vs_vocab.png docs/gemma_draft_latency_vs_vocab.png
