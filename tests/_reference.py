"""Loading the MXNet 1.9.1 reference numbers (made by reference/make_mxnet_reference.py)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

PATH = Path(__file__).parent / "reference" / "mxnet_reference.json"


@functools.cache
def reference() -> dict[str, Any]:
    return json.loads(PATH.read_text())


def f32(data: Any) -> np.ndarray:
    return np.asarray(data, dtype=np.float32)
