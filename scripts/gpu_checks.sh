#!/usr/bin/env bash
# GPU checks (issues #27/#28), for a lent GPU machine that cannot reach PyPI or the weights. Prepare here:
#   echo /.whl/ >> .git/info/exclude; echo /.gpu/ >> .git/info/exclude
#   .venv/bin/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .whl transformers==5.23.0
#   for m in qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct gemma-3-270m smollm2-135m-instruct; do
#       mkdir -p .gpu/configs/$m; cp ~/.cache/hf_vocabspec/v2/models/$m/config.json .gpu/configs/$m/; done
# then run this script there with .whl and .gpu carried. It prints (1) the forward microbench on CUDA from the real
# configs with random weights (a forward's time does not depend on the values) and (2) the generate contract
# (tests/test_contract.py: greedy identity over 10 architectures x batch 1/3 x 16 kwargs, streamer, pipeline,
# padded target law + power) with models and inputs on the GPU.
source "$(dirname "$0")/_gpu_common.sh"
C=.gpu/configs
timeout 200 python3 scripts/bench_forward.py --random-weights --device cuda --repeats 10 --kernels linear \
  --positions 1 2 3 4 5 8 16 \
  --models $C/qwen2.5-coder-1.5b-instruct $C/qwen2.5-coder-0.5b-instruct $C/gemma-3-270m $C/smollm2-135m-instruct \
  2>&1 | grep -v "^Loading" | tee "$OUT/bench_forward_cuda.md"
HF_VOCABSPEC_TEST_DEVICE=cuda timeout 280 python3 -m pytest -q -x -p no:cacheprovider tests/test_contract.py \
  -k "identical or streamer or pipeline or compacted or power or padded or confidence" 2>&1 | tail -5 \
  | tee "$OUT/contract_cuda.txt"
