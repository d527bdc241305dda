#!/usr/bin/env bash
# The GPU check (issue 42, item 6): on a machine with an NVIDIA GPU, install fabric with CuPy
# and a jax with CUDA from the wheels carried there, run what only a GPU run can check (the
# cupy and jax devices on the GPU: tests/cluster/test_cupy_gpu.py, test_jax_gpu.py) and the
# benchmarks (W4 fused expressions and W5 replayed graphs on cupy and on jax with CUDA beside
# the numexpr device on the machine's cores; W3 into GPU memory beside the host path), and
# write everything into one result file.
#
#   bash bench/gpu_check.sh [WHEELS] [RESULT]   # WHEELS: a folder of wheels (default wheels/);
#                                               # RESULT: the result file (gpu_check.txt)
#   bash bench/gpu_check.sh --dry [RESULT]      # on a CPU: the script itself, every step run
#                                               # small, with this Python (GPU tests skip)
#
# WHEELS holds what `pip download -d wheels '.[test]' cupy-cuda12x 'jax[cuda12]'` fetched for
# the GPU machine's Python on a machine with the network (a GPU machine may reach no
# registry): everything installs from it alone. Without it, the Python already there is used
# as it is. Each step's exit status is written into the result file and the script goes on
# past a failing step, so that one run reports all of them; it exits 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

dry=0
if [ "${1:-}" = "--dry" ]; then
    dry=1
    shift
fi
if [ "$dry" = 1 ]; then
    wheels=""
    result=${1:-gpu_check_dry.txt}
else
    wheels=${1:-wheels}
    result=${2:-gpu_check.txt}
fi
exec > >(tee "$result") 2>&1

failed=()
step() {  # step NAME COMMAND...: run it, timed, and note its exit status
    local name=$1 started status
    shift
    echo "== $name: $*"
    started=$(date +%s)
    "$@"
    status=$?
    echo "== $name: exit $status in $(( $(date +%s) - started )) s"
    if [ "$status" != 0 ]; then
        failed+=("$name")
    fi
}

echo "== gpu_check$([ "$dry" = 1 ] && echo ' (dry: a CPU run of the script)')" \
    "$(date -u +%FT%TZ) on $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null)"
if [ "$dry" = 0 ]; then
    step machine nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
fi
step cores nproc

python=python3
if [ -x .venv/bin/python ]; then
    python=.venv/bin/python
fi
if [ -n "$wheels" ] && [ -d "$wheels" ]; then
    step venv python3 -m venv .venv-gpu
    step install .venv-gpu/bin/python -m pip install -q --no-index --find-links "$wheels" \
        -e '.[test,cupy]' 'jax[cuda12]'
    python=.venv-gpu/bin/python
else
    echo "== no wheels folder${wheels:+ $wheels/}: using $python as it is"
fi
step versions "$python" -c "import numpy, numexpr; print('numpy', numpy.__version__, \
'numexpr', numexpr.__version__)
for name in ('jax', 'cupy'):
    try:
        module = __import__(name)
    except ImportError as exc:
        print(name, 'missing:', exc)
        continue
    print(name, module.__version__, module.devices() if name == 'jax' else \
module.cuda.runtime.getDeviceCount() if module.cuda.is_available() else 'no CUDA device')"

# What only a GPU checks: each GPU a device of each kind, the op table, updates and graphs
# against numpy there (skipped, counted, where no GPU is), and the refusals where none is.
step gpu-tests "$python" -m pytest -q -rs -p no:cacheprovider tests/cluster/test_cupy_gpu.py \
    tests/cluster/test_jax_gpu.py tests/cluster/test_cupy_device.py
# XLA's GPU arithmetic against numpy's in the last bits (measured on CPU in CI; on a GPU a
# failure says by how much its functions differ: the ulp table needs a column).
step unit-tests "$python" -m pytest -q -p no:cacheprovider tests/unit/test_jax_executor.py \
    tests/unit/test_cupy_ops.py

# The benchmarks: ratios in one run, every device on this machine.
if [ "$dry" = 1 ]; then  # (small, on the CPU's devices: the steps and their options run)
    step w5 "$python" bench/w5_graphs.py --runs 1 --steps cheap --large-calls 2 \
        --backends numexpr jax
    step w4 "$python" bench/w4_numexpr.py --runs 1 --elements 100000 --jax-device
    step w3 "$python" bench/w3_devices.py --runs 1 --mib 8 --backends numpy jax
else
    step w5 "$python" bench/w5_graphs.py --runs 5 --large-calls 100 \
        --backends numexpr jax cupy
    step w4 "$python" bench/w4_numexpr.py --runs 9 --jax-device --cupy-device
    step w3 "$python" bench/w3_devices.py --runs 5 --backends numpy cupy jax
fi

if [ "${#failed[@]}" != 0 ]; then
    echo "== done: ${#failed[@]} step(s) failed (${failed[*]}); $result"
    exit 1
fi
echo "== done: every step passed; $result"
