#!/usr/bin/env bash
# GPU checks for a machine with an NVIDIA GPU: the GPU tests on real CUDA (CuPy values
# through the device and local stores, home-GPU assignment with the optimizer states, host
# copies into 0-d and strided GPU arrays, event summaries on the values' GPU, compression's
# pack helpers, float16 summaries and epsilons, dist_sync servers keeping their values on the
# workers' GPUs, compressed CuPy pushes travelling packed to them), labkv.torch's CUDA path
# (bench/torch_gpu.py: a model.cuda() MLP trained through local and device stores, its
# parameters staying on the GPU and matching plain torch; skipped, saying so, where torch
# is missing or has no CUDA: '.[test]' brings it, PyPI's Linux wheel being the CUDA build,
# but .whl/ does not), a 2-worker GPU cluster as users start one (bench/gpu_cluster.py: dask-cuda's
# LocalCUDACluster when dask_cuda is installed, else workers pinned by CUDA_VISIBLE_DEVICES),
# the local-store benchmark with CuPy arrays against CuPy's own sum as the bound,
# dist_sync with CuPy pushes to host vs GPU servers, and what replicas=2 costs on a machine
# with cores to spare (bench/replicas.py; no GPU needed, but a 2-core machine, where the
# workers' CPU sets the ratio, cannot show it).
#
# Every step runs even when an earlier one fails (device time is scarce: one run should
# tell everything); the exit status says whether all passed. A GPU test that skips fails
# the check (bench/gpu_required.py; pytest alone exits 0 when, say, Dask is missing and the
# cluster tests skip), except one that needs two GPUs on a machine with one.
#
# On a GPU machine without network (Dask missing, CuPy there): run bench/gpu_wheels.sh
# where pip works (Dask and all its dependencies for CPython 3.12), copy .whl/ to that
# machine with the checkout, and this script installs them into /tmp/labkv-site and
# imports labkv from the checkout. With network it installs '.[test]' (and CuPy if absent).
#
# A dry run on a machine without a GPU, over the CuPy stand-in (2 simulated GPUs; checks
# the script, not CUDA): PYTHONPATH=tests/gpu_standin bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
# The whole check ends within GPU_CHECK_BUDGET seconds (default 390: a device lease
# of 7 minutes, with time to start): each step has its own limit, cut to what is left,
# so one hung step (a cluster that never starts) cannot eat the steps after it.
deadline=$((SECONDS + ${GPU_CHECK_BUDGET:-390}))
step() { # step LIMIT_S COMMAND...
    local limit=$1 left=$((deadline - SECONDS)) rc
    shift
    ((limit > left)) && limit=$left
    if ((limit < 5)); then
        echo "== FAILED (no time left): $*"
        status=1
        return
    fi
    echo "== $* (limit ${limit}s, $((deadline - SECONDS))s left)"
    timeout -k 10 "$limit" "$@"
    rc=$?
    if ((rc != 0)); then
        ((rc == 124 || rc == 137)) && echo "== TIMED OUT after ${limit}s: $*"
        echo "== FAILED (exit $rc): $*"
        status=1
    fi
}
timeout 20 nvidia-smi --query-gpu=name,memory.total --format=csv || true
if [ -d .whl ]; then
    # Dask and its dependencies (bench/gpu_wheels.sh), into a folder of their own; a
    # wheel is a zip, so without pip they are unpacked as they are.
    mkdir -p /tmp/labkv-site
    if ! timeout 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/labkv-site .whl/*.whl; then
        echo "== pip failed: unpacking the wheels instead"
        step 60 python3 -c "import glob, zipfile
for w in glob.glob('.whl/*.whl'):
    zipfile.ZipFile(w).extractall('/tmp/labkv-site')"
    fi
    export PYTHONPATH="$PWD:/tmp/labkv-site${PYTHONPATH:+:$PYTHONPATH}"
else
    python3 -c "import cupy" 2>/dev/null || timeout 120 python3 -m pip install -q 'cupy-cuda12x>=13'
    timeout 120 python3 -m pip install -q -e '.[test]' 2>&1 | tail -1 || true
fi
step 30 python3 -c "import cupy, labkv; print('cupy', cupy.__version__, 'gpus', labkv.num_gpus())"
step 30 python3 -c "import dask, distributed; print('dask', dask.__version__)"
report=$(mktemp --suffix=.xml)
step 170 python3 -m pytest -q -m gpu tests/test_gpu.py -rs -p no:cacheprovider --junitxml="$report"
step 20 python3 bench/gpu_required.py "$report"
step 90 python3 bench/torch_gpu.py
step 90 python3 bench/gpu_cluster.py
step 60 python3 bench/local.py --gpu --quick
step 90 python3 bench/dist_gpu.py --quick
step 60 python3 bench/replicas.py --quick
echo "== $([ $status = 0 ] && echo PASSED || echo FAILED) in ${SECONDS}s"
exit $status
