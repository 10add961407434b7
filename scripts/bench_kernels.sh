#!/usr/bin/env bash
# Issue #28's measurements of the fast linears (hf_vocabspec/kernels.py), on a quiet machine:
# 1. the forward microbench (M = 1..16 positions, F.linear vs fast linears, against one weight read) for pair G's
#    Gemma-3-270M and pair Q's Qwen2.5-Coder 1.5B / 0.5B, fp32 and bf16;
# 2. pair G in generate with and without the fast linears (bench --kernel-levers);
# 3. pair G batched (batch 1 2 4 8, with target-only + fast linears as a second baseline).
# ~40 min on 2 cores. Pair Q in generate: scripts/bench_pair_q.sh (long).
source "$(dirname "$0")/_common.sh"
make -s setup-pair
mkdir -p results
python scripts/bench_forward.py --repeats 3 --positions 1 2 3 4 5 6 8 16 \
    --models offline:gemma-3-270m offline:qwen2.5-coder-1.5b-instruct offline:qwen2.5-coder-0.5b-instruct \
    | grep -v "^Loading" | tee results/forward.md
publish results/forward.md "forward-$DATE.md"
# the drafter with weight-only quantized linears (what drafter.quantize_weights runs), bf16
python scripts/bench_forward.py --repeats 3 --positions 1 2 4 6 --dtypes bfloat16 --kernels fast int8 int4 \
    --models offline:qwen2.5-coder-0.5b-instruct | grep -v "^Loading" | tee results/forward-quantized.md
publish results/forward-quantized.md "forward-quantized-drafter-$DATE.md"
hf-vocabspec bench --target offline:gemma-3-270m --coverages 0.95 --context-tokens --kernel-levers \
    --workloads offline:sharegpt offline:humaneval --modes greedy --prompts 3 --max-new-tokens 48 --repeats 2 \
    --output results/kernel-levers --overwrite
publish results/kernel-levers/results.md "kernel-levers-gemma-$DATE.md"
publish results/kernel-levers/results.json "kernel-levers-gemma-$DATE.json"
hf-vocabspec bench --target offline:gemma-3-270m --coverages 0.95 --batch-sizes 1 2 4 8 --max-new-tokens 48 \
    --repeats 2 --output results/batched --overwrite
publish results/batched/results.md "batched-gemma-$DATE.md"
publish results/batched/results.json "batched-gemma-$DATE.json"
