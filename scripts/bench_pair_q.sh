#!/usr/bin/env bash
# README "Pair Q" tables: Qwen2.5-Coder-0.5B-Instruct drafting for Qwen2.5-Coder-1.5B-Instruct (target fp32, and
# bf16 where the CPU has native bf16). First `hf-vocabspec tune` picks (k, L, context tokens, confidence threshold,
# the drafter's weights: as loaded / int8 / int4)
# from measured costs on the first held-out ShareGPT conversations (and checks its choice against 13 measured
# settings on other prompts), then scripts/bench_pair_q.py runs target-only, HF assisted (default schedule and
# fixed L = 2 3 5 8), the trimmed drafter without/with context tokens and under HF's default schedule, and the
# tuned drafter side by side on prompts from the other held-out half and HumanEval, plus draft-step latencies,
# checkpoint sizes and peak RSS. Long: a 1.5B fp32 decode step is ~0.2-0.35 s on 2 cores (~2 h with the
# defaults; run on a quiet machine). Extra args go to the bench script, e.g. --modes greedy --repeats 1.
source "$(dirname "$0")/_common.sh"
make -s setup-pair
DTYPE="$(lscpu | grep -q avx512_bf16 && echo bfloat16 || echo float32)"
hf-vocabspec tune --target offline:qwen2.5-coder-1.5b-instruct --drafter offline:qwen2.5-coder-0.5b-instruct \
    --drafter-dtype "$DTYPE" --conversations 8 --max-new-tokens 48 --draft-lengths 2 3 4 5 6 8 10 12 16 20 \
    --weight-quantizations none int8 int4 \
    --validate 3 --output results/tune-pair-q --overwrite | tee results/tune-pair-q.log
python scripts/bench_pair_q.py --tuned results/tune-pair-q/drafter --output results/bench-pair-q "$@"
publish results/tune-pair-q.log "tune-pair-q-$DATE.md"
publish results/bench-pair-q/results.md "pair-q-$DATE.md"
publish results/bench-pair-q/results.json "pair-q-$DATE.json"
