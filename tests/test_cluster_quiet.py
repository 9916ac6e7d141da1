"""The embedded cluster's logging stays quiet where labkv already reports the error."""

from __future__ import annotations

import logging

import pytest

from labkv.cluster import run


def _fails(kv):
    raise ValueError(f"rank {kv.rank} fails on purpose")


def _worker_records(handle, text):
    logs = handle.client.get_worker_logs()
    return [msg for records in logs.values() for _, msg in records if text in msg]


def test_a_failed_rank_is_raised_by_run_not_logged_by_its_worker(handle):
    with pytest.raises(ValueError, match="fails on purpose"):
        run(_fails, num_workers=2, cluster=handle)
    # Any other failed task is still logged by its worker (the logs are read right) ...
    future = handle.client.submit(_fails, None, pure=False, key="not-a-rank-task")
    with pytest.raises(AttributeError):
        future.result(timeout=30)
    assert _worker_records(handle, "not-a-rank-task")
    # ... but a rank's failure is reported once, by run, in the caller.
    assert not _worker_records(handle, "labkv-rank-")


def _printed_levels():
    handlers = logging.getLogger("distributed").handlers
    return {h.level for h in handlers if isinstance(h, logging.StreamHandler)}


def test_the_embedded_cluster_workers_print_errors_only(handle):
    levels = handle.client.run(_printed_levels)
    assert all(printed == {logging.ERROR} for printed in levels.values()), levels
