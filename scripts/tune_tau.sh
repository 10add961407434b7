#!/usr/bin/env bash
# README "Tuning predicts what it measures" table: `hf-vocabspec tune --validate` on pair G (gemma-3-270m, bf16 copy
# as drafter) and pair Q (Qwen2.5-Coder 0.5B -> 1.5B), greedy and T=1. Each run scores the real trimmed drafter
# along the target's own continuations of held-out ShareGPT prompts (6; 16 for G at T=1), searches (k, L, context tokens, confidence
# threshold), then generates from the SAME prompts at the tuned k with L = 3 5 8 12 (and the tuned setting) next to
# target-only (--validate-on scored: the simulation's test; `hf-vocabspec tune --validate N` alone tests the choice
# on other prompts); scripts/tune_tau_table.py puts predicted and measured tau side by side. ~30 min on 2 cores
# (pair Q dominates). Extra args go to every tune run, e.g. --conversations 3 --validate 3.
source "$(dirname "$0")/_common.sh"
make -s setup-pair
DTYPE="$(lscpu | grep -q avx512_bf16 && echo bfloat16 || echo float32)"
run() {  # pair target drafter mode conversations [extra tune args]
    hf-vocabspec tune --target "$2" --drafter "$3" --drafter-dtype "$DTYPE" --mode "$4" --conversations "$5" \
        --max-new-tokens 48 --draft-lengths 2 3 4 5 6 8 10 12 16 20 --validate "$5" --validate-on scored \
        --validate-draft-lengths 3 5 8 12 --output "results/tune-$1-$4" --overwrite "${@:6}" | tee "results/tune-$1-$4.log"
}
G=(g offline:gemma-3-270m offline:gemma-3-270m)
Q=(q offline:qwen2.5-coder-1.5b-instruct offline:qwen2.5-coder-0.5b-instruct)
run "${G[@]}" greedy 6 "$@"
run "${G[@]}" t1 16 "$@"  # sampled: more rounds for the same noise
run "${Q[@]}" greedy 6 "$@"
run "${Q[@]}" t1 6 "$@"
python scripts/tune_tau_table.py results/tune-{g,q}-{greedy,t1}/tune.json > results/tune-tau.md
publish results/tune-tau.md "tune-tau-$DATE.md"
for r in g-greedy q-greedy; do publish "results/tune-$r/tune.json" "tune-$r-$DATE.json"; done
