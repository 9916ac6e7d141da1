#!/usr/bin/env bash
# Fetch, on a machine with network, the wheels bench/gpu_check.sh needs on a GPU machine
# that has none: that machine's Python 3.12 image has numpy, CuPy, pytest, cloudpickle,
# msgpack, psutil, toolz, pyyaml, click, jinja2, fsspec, packaging, sortedcontainers and
# urllib3, but not Dask. The wheels land in .whl/ (ignored by git, about 4 MiB);
# gpu_check.sh installs them from there when the folder exists.
set -euo pipefail
cd "$(dirname "$0")/.."
versions=$(python3 - <<'PY'
from importlib.metadata import version
print(" ".join(f"{p}=={version(p)}" for p in ("dask", "distributed")))
PY
)
rm -rf .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl \
    $versions tornado tblib zict partd locket
ls .whl
