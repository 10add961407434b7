#!/usr/bin/env bash
# Exact expected acceptance of the ideal trimmed drafter vs kept size, pairs G and S (machine-independent):
# docs/results/acceptance-vs-kept-size-{gemma,smollm2}-DATE.{md,png}.
source "$(dirname "$0")/_common.sh"
for pair in gemma:offline:gemma-3-270m smollm2:offline:smollm2-135m-instruct; do
    name="${pair%%:*}"; target="${pair#*:}"
    hf-vocabspec acceptance --target "$target" --conversations 32 --output "results/acceptance-$name"
    publish "results/acceptance-$name/results.md" "acceptance-vs-kept-size-$name-$DATE.md"
    publish "results/acceptance-$name/acceptance_vs_vocab.png" "acceptance-vs-kept-size-$name-$DATE.png"
done
