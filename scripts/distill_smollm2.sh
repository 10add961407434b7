#!/usr/bin/env bash
# A 4-layer SmolLM2 student distilled for a time budget (docs/results/distill-smollm2-DATE.md: KL and top-1 agreement).
source "$(dirname "$0")/_common.sh"
hf-vocabspec distill --target offline:smollm2-135m-instruct --num-layers 4 --time-budget "${BUDGET:-300}" \
    --output results/distilled/smollm2-4l
{ echo '```json'; cat results/distilled/smollm2-4l/distill_report.json; echo '```'; } > results/distill-smollm2.md
publish results/distill-smollm2.md "distill-smollm2-$DATE.md"
