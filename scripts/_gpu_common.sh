# Sourced by the GPU scripts (gpu_checks.sh, gpu_generate.sh) on a lent GPU machine that cannot reach PyPI: install
# the carried wheels (.whl) into /tmp/site, put them and this checkout on the path, make $OUT, name the GPU and host.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/gpu-checks}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
lscpu | grep -m1 "Model name"
