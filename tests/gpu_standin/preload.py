"""Worker preload of the stand-in cluster: ``import cupy`` finds the stand-in.

Dask runs a copy of this file from the worker's scratch folder, so the stand-in's
folder comes in ``LABKV_STANDIN_PATH`` (a ``PYTHONPATH`` in Dask's pre-spawn
environment would lose to the test process's own)."""

import os
import sys

sys.path.insert(0, os.environ["LABKV_STANDIN_PATH"])
