#!/usr/bin/env bash
# GPU checks for a machine with an NVIDIA GPU: the GPU tests (CuPy values through the
# device and local stores, home-GPU assignment, compression and optimizers on the GPU)
# and the local-store benchmark with CuPy arrays against CuPy's own sum as the bound.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv || true
python3 -m pip install -q -e '.[test]' 'cupy-cuda12x>=13' 2>&1 | tail -1 || true
python3 -c "import cupy, labkv; print('cupy', cupy.__version__, 'gpus', labkv.num_gpus())"
python3 -m pytest -q -m gpu tests/test_gpu.py -rs
python3 bench/local.py --gpu --quick
