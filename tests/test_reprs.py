"""Notebook reprs: a store's and a cluster handle's HTML hold what they must."""

from __future__ import annotations

import numpy as np

import labkv

HOSTILE = "<img src=x onerror=alert(1)>"


def test_a_local_stores_html_lists_keys_with_shape_dtype_placement_and_bytes():
    kv = labkv.create("local")
    kv.init(["w", HOSTILE], [np.zeros((4, 8), np.float32), np.zeros(3, np.int64)])
    html = kv._repr_html_()
    assert "type <code>local</code>" in html
    assert "<td>w</td><td>4x8</td><td>float32</td><td>cpu(0)</td><td>128 B</td>" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and HOSTILE not in html
    assert "<td>cpu(0)</td><td>152 B</td>" in html  # bytes per device
    assert "2 keys, 152 B" in html


def test_a_cluster_stores_html_names_rank_servers_replicas_and_bytes_per_server(handle):
    kv = labkv.create("dist_sync", cluster=handle, num_servers=2, replicas=2, bigarray_bound=8)
    try:
        kv.init("big", np.zeros(16, np.float32))
        kv.init("small", np.zeros(2, np.float64))
        html = kv._repr_html_()
        assert "type <code>dist_sync</code> · rank 0 of 1 · servers 2 · replicas 2" in html
        assert (
            "<td>big</td><td>16</td><td>float32</td><td>s0[0:8] s1[8:16]</td><td>64 B</td>" in html
        )
        small = kv.placement()["small"][0]["server"]
        assert f"<td>small</td><td>2</td><td>float64</td><td>s{small}</td><td>16 B</td>" in html
        held = {s["server"]: s["bytes_held"] for s in kv.server_load()}
        for sid in (0, 1):
            assert f"<td>{sid}</td><td>cpu(0)</td><td>{held[sid]} B</td>" in html
        workers = handle.workers()
        assert html.count("(primary)") == 2 and all(w in html for w in workers)
    finally:
        kv.close()


def test_the_handles_html_shows_address_workers_and_each_nodes_check(handle):
    html = handle._repr_html_()
    assert handle.address in html and "embedded LocalCluster" in html
    assert f"{len(handle.workers())} workers" in html
    from labkv import __version__

    rows = html.split("<tbody>")[1]
    for node in ["scheduler", *handle.workers()]:
        assert f"<tr><td>{node}</td><td>{__version__}</td>" in rows
    assert rows.count("<td>ok</td>") == 1 + len(handle.workers())
