"""Attaching to a scheduler and workers started as separate ``dask`` processes
on 127.0.0.1: over plain TCP, and over TLS with certificates made here by
openssl (a client without the right certificate is refused)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from labkv.cluster import connect, run
from tests._cli import Procs, start_scheduler, start_worker

pytestmark = pytest.mark.slow


def _start(procs: Procs, tmp: Path, extra: list[str], protocol: list[str]) -> str:
    address = start_scheduler(procs, tmp, extra=[*protocol, *extra])
    start_worker(procs, "w", address, tmp, nworkers=2, extra=extra)
    return address


def _sum_ranks(kv):
    kv.init("w", np.zeros(3))
    kv.push("w", np.full(3, kv.rank + 1.0))
    return kv.pull("w")


def test_attach_to_cli_scheduler_and_workers(tmp_path):
    procs = Procs(tmp_path)
    try:
        address = _start(procs, tmp_path, [], [])
        with connect(address, n_workers=2) as handle:
            assert handle.cluster is None and len(handle.workers()) == 2
            for value in run(_sum_ranks, num_workers=2, cluster=handle):
                np.testing.assert_array_equal(value, [3.0, 3.0, 3.0])
        # closing an attached handle leaves the scheduler running
        assert procs.procs[0].poll() is None
    finally:
        procs.stop()


def _openssl(cmd: str, cwd: Path) -> None:
    subprocess.run(["bash", "-c", cmd], cwd=cwd, check=True, timeout=60, capture_output=True)


def _make_certs(d: Path) -> None:
    """A CA and one node certificate (scheduler, workers and client), plus an unrelated CA."""
    _openssl(
        'openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj "/CN=labkv-test-ca"',
        d,
    )
    _openssl(
        'openssl req -newkey rsa:2048 -nodes -keyout node.key -out node.csr -subj "/CN=labkv-node"',
        d,
    )
    (d / "ext.cnf").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    _openssl(
        "openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out node.pem -days 2 -extfile ext.cnf",
        d,
    )
    _openssl(
        'openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.pem -days 2 -subj "/CN=other-ca"',
        d,
    )


def _replicated_rounds_use_the_stream(handle) -> None:
    """A replicated store's log entries reach the backup on a stream
    (``labkv.cluster._transport.stream``), over TLS on a TLS cluster."""
    import labkv
    from labkv.cluster._transport.stream import calls_served as entries_served

    kv = labkv.create("dist_sync", cluster=handle, num_servers=1, replicas=2)
    try:
        kv.init("w", np.zeros(3, np.float32))
        backup = kv.placement()["w"][0]["replicas"][1]
        before = handle.client.run(entries_served, workers=[backup])[backup]
        out = np.empty(3, np.float32)
        for _ in range(4):
            kv.push("w", np.ones(3, np.float32))
            kv.pull("w", out=out)
        np.testing.assert_array_equal(out, [1.0, 1.0, 1.0])
        assert handle.client.run(entries_served, workers=[backup])[backup] - before == 4
    finally:
        kv.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_cluster_with_own_certificates_refuses_a_client_without_them(tmp_path):
    from distributed import Security

    _make_certs(tmp_path)
    ca, cert, key = (str(tmp_path / n) for n in ("ca.pem", "node.pem", "node.key"))
    procs = Procs(tmp_path)
    try:
        tls = ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]
        address = _start(procs, tmp_path, tls, ["--protocol", "tls"])
        assert address.startswith("tls://")
        security = Security(
            tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, require_encryption=True
        )
        with connect(address, n_workers=2, security=security) as handle:
            for value in run(_sum_ranks, num_workers=2, cluster=handle):
                np.testing.assert_array_equal(value, [3.0, 3.0, 3.0])
            _replicated_rounds_use_the_stream(handle)
        with pytest.raises(TypeError, match=r"pass security=distributed\.Security\("):
            connect(address, timeout="5s")  # no certificate at all
        stranger = Security(
            tls_ca_file=str(tmp_path / "other.pem"),
            tls_client_cert=str(tmp_path / "other.pem"),
            tls_client_key=str(tmp_path / "other.key"),
            require_encryption=True,
        )
        with pytest.raises(OSError):  # a certificate from another CA
            connect(address, security=stranger, timeout="5s")
    finally:
        procs.stop()
