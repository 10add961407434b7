#!/usr/bin/env bash
# Verify(L+1)/decode latency ratio with the target's own LM head and with hf_vocabspec's verify head, on pair G's
# target (offline:gemma-3-270m, fp32), both in one process, alternating round by round (~3 min on 2 cores):
# docs/results/verify-head-gemma-DATE.md. Extra args go to the helper, e.g. --rows 6 9 13 --repeats 20.
source "$(dirname "$0")/_common.sh"
out="results/verify-head-gemma.md"
{
echo "SIMD: $(grep -m1 -o -E 'avx512[a-z_0-9]*|avx2|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
ps -eo pid,pcpu,comm --sort=-pcpu | awk 'NR>1 && $2>20 {print "busy: " $0}'
python scripts/verify_head.py --model offline:gemma-3-270m --dtype float32 "$@"
} | tee "$out"
publish "$out" "verify-head-gemma-$DATE.md"
