#!/usr/bin/env bash
# Verify-step figures for issue #15: verify(L+1)/decode latency ratio, original head vs hf_vocabspec's verify
# head, on pair G's target (offline:gemma-3-270m, fp32). Run on a quiet machine; extra args go to the helper,
# e.g. scripts/verify_head.sh --rows 6 9 13 --repeats 20.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
echo "date $(date -u +%FT%TZ)"
lscpu | grep -E '^(Model name|CPU\(s\)|Thread\(s\) per core|L3 cache)' || true
flags=$(grep -m1 -o -E 'avx512[a-z_0-9]*|avx2|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ' || true)
echo "SIMD flags: ${flags:-none}"
echo "load: $(cat /proc/loadavg)"
echo "busy processes (>20% CPU):"
ps -eo pid,pcpu,comm --sort=-pcpu | awk 'NR>1 && $2>20' || true
exec "$PY" scripts/verify_head.py "$@"
