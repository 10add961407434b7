#!/usr/bin/env bash
# README "Pair Q" tables: Qwen2.5-Coder-0.5B-Instruct drafting for Qwen2.5-Coder-1.5B-Instruct (target fp32, and
# bf16 where the CPU has native bf16). First `hf-vocabspec tune` picks (k, L, context tokens) on held-out ShareGPT
# from measured costs, then scripts/bench_pair_q.py runs target-only, HF assisted (default schedule and fixed
# L = 2 3 5 8), the trimmed drafter without/with context tokens and the tuned drafter side by side, greedy,
# T=0.7 and T=1, ShareGPT and HumanEval, plus draft-step latencies, checkpoint sizes and peak RSS.
# Long: a 1.5B fp32 decode step is ~0.35 s on 2 cores (~2-3 h with the defaults below; run on a quiet machine).
# Extra args go to the bench script, e.g. --modes greedy --workloads offline:sharegpt.
source "$(dirname "$0")/_common.sh"
make -s setup-pair
hf-vocabspec tune --target offline:qwen2.5-coder-1.5b-instruct --drafter offline:qwen2.5-coder-0.5b-instruct \
    --drafter-dtype "$(lscpu | grep -q avx512_bf16 && echo bfloat16 || echo float32)" --output results/tune-pair-q
python scripts/bench_pair_q.py --tuned results/tune-pair-q/drafter --output results/bench-pair-q "$@"
cp results/bench-pair-q/results.md "docs/bench-pair-q-$DATE.md"
cp results/bench-pair-q/results.json "docs/bench-pair-q-$DATE.json"
cp results/tune-pair-q/tune.json "docs/tune-pair-q-$DATE.json"
