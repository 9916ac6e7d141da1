#!/usr/bin/env bash
# Fetch, on a machine with network, the wheels bench/gpu_check.sh needs on a GPU machine
# that has none: that machine's Python 3.12 image has numpy, CuPy and pytest, but not
# Dask. Fetched: the dask and distributed installed here, with all their dependencies
# for CPython 3.12 on x86_64 Linux (about 6 MiB; the image may hold some of them already:
# the copies here are installed beside them, in a folder of their own). The wheels land
# in .whl/ (ignored by git); gpu_check.sh installs them from there when it exists.
set -euo pipefail
cd "$(dirname "$0")/.."
versions=$(python3 - <<'PY'
from importlib.metadata import version
print(" ".join(f"{p}=={version(p)}" for p in ("dask", "distributed")))
PY
)
rm -rf .whl
# shellcheck disable=SC2086 # $versions is a list of requirements
python3 -m pip download -q --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl $versions
ls .whl
python3 - <<'PY'
# Each requirement of dask and distributed must have come (a wheel missed would only
# show on the GPU machine, as an ImportError in its first step).
import re
import zipfile
from pathlib import Path

names = {re.sub(r"[-_.]+", "-", w.name.split("-")[0]).lower() for w in Path(".whl").glob("*.whl")}
for wheel in Path(".whl").glob("d*.whl"):
    meta = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
    for line in zipfile.ZipFile(wheel).read(meta).decode().splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            req = re.split(r"[ ;<>=!~\[]", line.split(":", 1)[1].strip())[0]
            assert re.sub(r"[-_.]+", "-", req).lower() in names, f"{wheel.name} needs {req}"
print(f"{len(names)} wheels, every requirement of dask and distributed among them")
PY
