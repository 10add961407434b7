#!/usr/bin/env bash
# GPU end-to-end generate check (issue #36), for a lent GPU machine that cannot reach PyPI or the weights.
# Prepare here (once):
#   echo /.whl/ >> .git/info/exclude; echo /.gpu/ >> .git/info/exclude
#   .venv/bin/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .whl transformers==5.24.0
#   for m in qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct; do
#       mkdir -p .gpu/configs/$m; cp ~/.cache/hf_vocabspec/v2/models/$m/config.json .gpu/configs/$m/; done
# then, with the device tool: run `bash scripts/gpu_generate.sh` carrying .whl and .gpu (timeout_s 590).
# Measured so far (docs/results/gpu-generate-h200-2026-11-28.md): pair Q's shapes at batch 1, eager, compiled and
# transformers' assisted loop. Open, so first now: why our eager round is slower than transformers' (--profile:
# profile.txt) and where the compiled path's 8 host syncs per round come from (sync_sites.txt); then batch 16 and
# the 7B-class shape compiled, which the budget skipped. Also: what the confidence stop's one read per drafted token
# costs on a GPU (rows "stop read per draft": the same rounds with the stop on at a threshold no draft falls below),
# which decides whether a GPU needs a stop read without waiting (the default policy, L=12 stop 0.4, reads so).
# It writes (1) scripts/bench_gpu_generate.py's table into $OUT/gpu_generate.md/.json (target-only eager and
# static cache + compile; our engine eager and on the static cache with its verify and draft steps compiled, the
# verify alone compiled, every draft accepted / none; pair-Q and 7B-class shapes from the real configs, random
# weights, acceptance pinned by construction; tracebacks of failed rows in $OUT/errors.log), (2) the compiled
# path's exactness tests on CUDA (real torch.compile, CUDA graphs: greedy identity with compiled target-only,
# left-padded rows) and (3) the generate contract's greedy-identity cases on CUDA with the time left.
source "$(dirname "$0")/_gpu_common.sh"
start=$(date +%s)
timeout 460 python3 scripts/bench_gpu_generate.py --configs .gpu/configs --out "$OUT" --budget "${BUDGET:-430}" \
  --profile --assisted-caches dynamic --no-drafter-shape \
  --plan ${PLAN:-pair-q:eager:1 pair-q:assisted:1 pair-q:compiled:1 pair-q:compiled:16 7b:compiled:1} \
  2>&1 | grep -v "^\[transformers\]\|^Loading\|warn(" | tee "$OUT/bench.log" | grep -v "^\s*$" | grep "^|\|^Machine\|^Total\|Error\|error"
echo "compiled path on CUDA at $(( $(date +%s) - start )) s"
# (on CUDA a static cache compiles: each case compiles its tiny models, 20-40 s; the most telling first)
C=tests/test_contract.py
# (the batch-3 identity and the power test passed on an H200, 2026-11-28: the counting test, fixed after, first)
HF_VOCABSPEC_TEST_DEVICE=cuda timeout 80 python3 -m pytest -v -p no:cacheprovider \
  $C::test_static_cache_with_compile_runs_compiled_steps "$C::test_static_cache_identical_to_target_only[llama4-3-greedy]" \
  2>&1 | grep "PASS\|FAIL\|ERROR\|passed\|failed" | tee "$OUT/compiled_cuda.txt"  # names: which one is slow
left=$(( 560 - ($(date +%s) - start) ))
echo "contract on CUDA with ${left} s left"
if [ "$left" -gt 40 ]; then
  HF_VOCABSPEC_TEST_DEVICE=cuda timeout "$left" python3 -m pytest -q -x -n 4 -p no:cacheprovider tests/test_contract.py \
    -k "identical and not static" 2>&1 | tail -4 | tee "$OUT/contract_cuda.txt"
fi
