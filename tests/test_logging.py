"""labkv's logger on real LocalClusters: a rank lost and replaced, a server
failed over to its backup, and a record made in a rank on a Dask worker, all
as log records of the process that called ``connect``."""

from __future__ import annotations

import logging
import os
import signal

import numpy as np
import pytest

import labkv
from labkv.cluster import connect, run
from tests.test_cluster_elastic_dask import _run

pytestmark = pytest.mark.slow  # real LocalClusters whose workers are killed


@pytest.fixture
def spare():
    handle = connect(n_workers=3, dashboard_address=None, memory_limit="1GiB", set_as_default=False)
    yield handle
    handle.close()


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("labkv")]


def test_a_lost_and_replaced_rank_are_log_records(spare, caplog):
    caplog.set_level(logging.INFO, logger="labkv")
    _run(spare, num_servers=1, kwargs={"kills": [(1, 0, 3, 0, True)]})
    messages = _messages(caplog)
    lost = [m for m in messages if m.startswith("rank 1 lost with Dask worker")]
    replaced = [m for m in messages if m.startswith("rank 1 replaced on Dask worker")]
    assert lost and replaced, messages
    assert any("server(s) started" in m for m in messages)
    assert any("cluster check passed" in m for m in messages)


def _pid():
    return os.getpid()


def test_a_failover_is_a_warning(spare, caplog):
    caplog.set_level(logging.INFO, logger="labkv")
    kv = labkv.create("dist_sync", cluster=spare, num_servers=1, replicas=2, timeout=30)
    try:
        kv.init("w", np.zeros(4, np.float32))
        primary = kv.placement()["w"][0]["replicas"][0]
        os.kill(spare.client.run(_pid, workers=[primary])[primary], signal.SIGKILL)
        for _ in range(3):
            kv.push("w", np.ones(4, np.float32))
            kv.pull("w", out=np.zeros(4, np.float32))
        warned = [
            r
            for r in caplog.records
            if r.levelno == logging.WARNING and "primary on " + primary in r.getMessage()
        ]
        assert warned and "was lost" in warned[0].getMessage(), _messages(caplog)
    finally:
        kv.close()


def _log_from_rank(kv):
    logging.getLogger("labkv.test").warning("a record of rank %d on its worker", kv.rank)
    return os.getpid()


def test_records_made_in_ranks_on_workers_are_forwarded(spare, caplog):
    caplog.set_level(logging.INFO, logger="labkv")
    pids = run(_log_from_rank, num_workers=2, cluster=spare)
    assert os.getpid() not in pids

    def forwarded():
        found = {m for m in _messages(caplog) if m.startswith("a record of rank")}
        return found == {"a record of rank 0 on its worker", "a record of rank 1 on its worker"}

    from tests._waiting import wait_until

    assert wait_until(forwarded, timeout=30), _messages(caplog)


def test_labkv_prints_no_record_until_the_application_configures_logging():
    import subprocess
    import sys

    code = (
        "import logging, labkv.cluster\n"
        "logging.getLogger('labkv').warning('a failover')\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "logging.getLogger('labkv').info('now shown')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "a failover" not in done.stderr and "INFO:labkv:now shown" in done.stderr
