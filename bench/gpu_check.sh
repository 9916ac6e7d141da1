#!/usr/bin/env bash
# GPU checks for a machine with an NVIDIA GPU: the GPU tests on real CUDA (CuPy values
# through the device and local stores, home-GPU assignment with the optimizer states, host
# copies into 0-d and strided GPU arrays, event summaries on the values' GPU, compression's
# pack helpers, float16 summaries and epsilons, dist_sync servers keeping their values on the
# workers' GPUs), a 2-worker GPU cluster as users start one (bench/gpu_cluster.py: dask-cuda's
# LocalCUDACluster when dask_cuda is installed, else workers pinned by CUDA_VISIBLE_DEVICES),
# the local-store benchmark with CuPy arrays against CuPy's own sum as the bound, and
# dist_sync with CuPy pushes to host vs GPU servers.
#
# Every step runs even when an earlier one fails (device time is scarce: one run should
# tell everything); the exit status says whether all passed. A GPU test that skips fails
# the check (bench/gpu_required.py; pytest alone exits 0 when, say, Dask is missing and the
# cluster tests skip), except one that needs two GPUs on a machine with one.
#
# On a GPU machine without network (Dask missing, CuPy there): run bench/gpu_wheels.sh
# where pip works, copy .whl/ to that machine with the checkout, and this script installs
# Dask from it and imports labkv from the checkout (checked with an image of the same
# packages). With network it installs '.[test]' (and CuPy if absent).
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
step() {
    echo "== $*"
    "$@" || { echo "== FAILED: $*"; status=1; }
}
nvidia-smi --query-gpu=name,memory.total --format=csv || true
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/labkv-site .whl/*.whl
    export PYTHONPATH="$PWD:/tmp/labkv-site${PYTHONPATH:+:$PYTHONPATH}"
else
    python3 -c "import cupy" 2>/dev/null || python3 -m pip install -q 'cupy-cuda12x>=13'
    python3 -m pip install -q -e '.[test]' 2>&1 | tail -1 || true
fi
step python3 -c "import cupy, labkv; print('cupy', cupy.__version__, 'gpus', labkv.num_gpus())"
step python3 -c "import dask, distributed; print('dask', dask.__version__)"
report=$(mktemp --suffix=.xml)
step python3 -m pytest -q -m gpu tests/test_gpu.py -rs -p no:cacheprovider --junitxml="$report"
step python3 bench/gpu_required.py "$report"
step python3 bench/gpu_cluster.py
step python3 bench/local.py --gpu --quick
step python3 bench/dist_gpu.py --quick
exit $status
