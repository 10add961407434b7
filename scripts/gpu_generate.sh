#!/usr/bin/env bash
# GPU end-to-end generate check (issue #36), for a lent GPU machine that cannot reach PyPI or the weights.
# Prepare here (once):
#   echo /.whl/ >> .git/info/exclude; echo /.gpu/ >> .git/info/exclude
#   .venv/bin/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .whl transformers==5.24.0
#   for m in qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct; do
#       mkdir -p .gpu/configs/$m; cp ~/.cache/hf_vocabspec/v2/models/$m/config.json .gpu/configs/$m/; done
# then, with the device tool: run `bash scripts/gpu_generate.sh` carrying .whl and .gpu (timeout_s 540).
# It prints (1) scripts/bench_gpu_generate.py's table (target-only eager and static cache + compile, transformers'
# assisted loop, our engine; pair-Q and 7B-class shapes, random weights, acceptance pinned by construction) into
# $OUT/gpu_generate.md/.json and (2) the generate contract's greedy-identity cases on CUDA with the time left.
source "$(dirname "$0")/_gpu_common.sh"
start=$(date +%s)
timeout 420 python3 scripts/bench_gpu_generate.py --configs .gpu/configs --out "$OUT" --budget "${BUDGET:-330}" \
  2>&1 | grep -v "^\[transformers\]\|^Loading\|warn(" | tee "$OUT/bench.log" | grep -v "^\s*$" | grep "^|\|^Machine\|^Total\|Error\|error" 
left=$(( 480 - ($(date +%s) - start) ))
echo "contract on CUDA with ${left} s left"
if [ "$left" -gt 30 ]; then
  HF_VOCABSPEC_TEST_DEVICE=cuda timeout "$left" python3 -m pytest -q -x -p no:cacheprovider tests/test_contract.py \
    -k "identical" 2>&1 | tail -4 | tee "$OUT/contract_cuda.txt"
fi
