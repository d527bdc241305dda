#!/usr/bin/env bash
# The GPU check (issue 42, item 6): on a machine with an NVIDIA GPU, install fabric and a
# jax with CUDA from wheels carried there, run what only a GPU run can check (the jax device
# on the GPU: tests/cluster/test_jax_gpu.py, then the jax tests that run anywhere) and the
# benchmarks (W5 replays, W4 fused expressions, with the numexpr device on the machine's
# cores in the same run), and write everything into one result file.
#
#   bash bench/gpu_check.sh [WHEELS] [RESULT]     # WHEELS: a folder of wheels (default
#                                                 # wheels/); RESULT: gpu_check.txt
#
# WHEELS holds what `pip download -d wheels '.[test]' 'jax[cuda12]'` fetched for the GPU
# machine's Python on a machine with the network (a GPU machine may reach no registry):
# everything installs from it alone. Without it, the Python already there is used as it is.
# Each step's exit status is written into the result file, and the script goes on past a
# failing step, so that one run reports all of them.
set -uo pipefail
cd "$(dirname "$0")/.."
wheels=${1:-wheels}
result=${2:-gpu_check.txt}
exec > >(tee "$result") 2>&1

step() {  # step NAME COMMAND...: run it, timed, and note its exit status
    local name=$1 started status
    shift
    echo "== $name: $*"
    started=$(date +%s)
    "$@"
    status=$?
    echo "== $name: exit $status in $(( $(date +%s) - started )) s"
}

echo "== gpu_check $(date -u +%FT%TZ) on $(hostname)," \
    "commit $(git rev-parse --short HEAD 2>/dev/null)"
step machine nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
step cores nproc
if [ -d "$wheels" ]; then
    step venv python3 -m venv .venv-gpu
    step install .venv-gpu/bin/pip install -q --no-index --find-links "$wheels" \
        -e '.[test]' 'jax[cuda12]'
    python=.venv-gpu/bin/python
else
    echo "== no $wheels/: using $(command -v python3) as it is"
    python=python3
fi
step versions "$python" -c "import jax, numpy, numexpr; print('jax', jax.__version__, \
'numpy', numpy.__version__, 'numexpr', numexpr.__version__); print(jax.devices())"
# What only a GPU checks: every GPU a device, the op table and graphs against numpy there.
step gpu-tests "$python" -m pytest -q -rs tests/cluster/test_jax_gpu.py
# XLA's GPU arithmetic against numpy's in the last bits (measured on CPU in CI; on the GPU
# a failure here says by how much the GPU's functions differ: the ulp table needs a column).
step gpu-ulps "$python" -m pytest -q tests/unit/test_jax_executor.py
# The jax tests that run anywhere, here on GPU 0 (the two XLA CPU devices' test on the CPU).
step jax-tests "$python" -m pytest -q tests/cluster/test_jax_device.py \
    tests/cluster/test_differential.py tests/cluster/test_graphs.py -k jax
step w5 "$python" bench/w5_graphs.py --runs 5 --large-calls 100
step w4 "$python" bench/w4_numexpr.py --runs 9 --jax-device
echo "== done: $result"
