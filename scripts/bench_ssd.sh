#!/usr/bin/env bash
# SSD next to ordinary drafting, pair S with an fp32 trimmed drafter, worker mode
# (docs/results/ssd-vs-ordinary-smollm2-DATE.{md,json}).
source "$(dirname "$0")/_common.sh"
hf-vocabspec bench --target offline:smollm2-135m-instruct --drafter-dtype float32 --coverages 0.95 --ssd \
    --ssd-mode worker --modes greedy t1 --prompts 2 --max-new-tokens 48 --repeats 2 --output results/bench-ssd
publish results/bench-ssd/results.md "ssd-vs-ordinary-smollm2-$DATE.md"
publish results/bench-ssd/results.json "ssd-vs-ordinary-smollm2-$DATE.json"
