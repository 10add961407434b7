#!/usr/bin/env bash
# README RDK table + docs/rdk_{gemma_t1,gemma_t07,smollm2_t1}.png: kernels fitted, scored and generated.
source "$(dirname "$0")/_common.sh"
hf-vocabspec rdk-bench --target offline:gemma-3-270m --temperatures 1.0 0.7 --output results/rdk-gemma
hf-vocabspec rdk-bench --target offline:smollm2-135m-instruct --temperatures 1.0 --output results/rdk-smollm2
cp results/rdk-gemma/rdk_tau_vs_vocab.png docs/rdk_gemma_t1.png
cp results/rdk-smollm2/rdk_tau_vs_vocab.png docs/rdk_smollm2_t1.png
echo "tables: results/rdk-gemma/results.md, results/rdk-smollm2/results.md"
