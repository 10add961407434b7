#!/usr/bin/env bash
# README exact expected acceptance table + docs/acceptance_{gemma,smollm2}.png (machine-independent).
source "$(dirname "$0")/_common.sh"
for pair in gemma:offline:gemma-3-270m smollm2:offline:smollm2-135m-instruct; do
    name="${pair%%:*}"; target="${pair#*:}"
    hf-vocabspec acceptance --target "$target" --conversations 32 --output "results/acceptance-$name"
    cp "results/acceptance-$name/results.md" "docs/acceptance-$name-$DATE.md"
    cp "results/acceptance-$name/acceptance_vs_vocab.png" "docs/acceptance_$name.png"
done
