"""The check a failover test ends with: the disturbed run's numbers are the undisturbed run's."""

from __future__ import annotations

import numpy as np


def assert_same_run(values: list, states: tuple, want: list, want_states: tuple) -> None:
    """Final values, and optimizer states ``(num_update, per-key update counts,
    per-key states)``, equal to the undisturbed run's bit for bit."""
    for a, b in zip(values, want, strict=True):
        np.testing.assert_array_equal(a, b)
    assert states[:2] == want_states[:2]
    for key in want_states[2]:
        for a, b in zip(states[2][key], want_states[2][key], strict=True):
            np.testing.assert_array_equal(a, b)
