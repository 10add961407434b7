#!/usr/bin/env bash
# README headline table: pair G tokens/s (docs/results/throughput-gemma-DATE.{md,json} and its plots; ~15 min on 2 cores).
source "$(dirname "$0")/_common.sh"
hf-vocabspec bench --target offline:gemma-3-270m --coverages 0.95 0.99 --context-tokens \
    --modes greedy t0.7 t1 --prompts 3 --max-new-tokens 64 --repeats 2 --output results/bench-gemma
publish results/bench-gemma/results.md "throughput-gemma-$DATE.md"
publish results/bench-gemma/results.json "throughput-gemma-$DATE.json"
publish results/bench-gemma/throughput_vs_vocab.png "throughput-vs-kept-size-gemma-$DATE.png"
publish results/bench-gemma/draft_latency_vs_vocab.png "draft-latency-vs-kept-size-gemma-$DATE.png"
