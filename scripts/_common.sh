# Sourced by every script here: run from the repository root with the project's venv, print the machine
# and its load first (ratios are only comparable on one machine, measured on a quiet one).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
make -s setup
export PATH="$PWD/.venv/bin:$PATH"
DATE="${DATE:-$(date +%F)}"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores," \
     "$(lscpu | grep -q avx512_bf16 && echo 'WITH' || echo 'without') AVX-512 BF16; load: $(cut -d' ' -f1-3 /proc/loadavg)"
busy=$(awk -v n="$(nproc)" '{print ($1 > 0.5 * n) ? 1 : 0}' /proc/loadavg)
if [ "$busy" = 1 ]; then echo "WARNING: the machine is busy (load above half the cores): timings will be noisy" >&2; fi
# Results land in docs/results/, each file named by what it measures (+ date); a markdown file's first line
# names the script that wrote it. publish SRC NAME copies one result there.
RESULTS=docs/results
SCRIPT="scripts/$(basename "$0")"
mkdir -p "$RESULTS"
publish() {
    case "$2" in
        *.md) { echo "Script: \`$SCRIPT\` (run $DATE)."; echo; cat "$1"; } > "$RESULTS/$2" ;;
        *) cp "$1" "$RESULTS/$2" ;;
    esac
}
