"""MinibatchSource over every source kind; prefetch; streams across epochs; memory."""

from __future__ import annotations

import threading
import time
import tracemalloc

import numpy as np
import pytest

from labkv.data import MinibatchSource, NpySource, Prefetcher

N = 103


@pytest.fixture
def data():
    rng = np.random.default_rng(1)
    return {
        "features": rng.standard_normal((N, 4)).astype(np.float32),
        "labels": np.arange(N, dtype=np.int64),
    }


def epoch_rows(src, epoch=0):
    mbs = list(src.iter_epoch(epoch))
    return np.concatenate([mb.indices for mb in mbs]), mbs


def check_matches(src, data):
    ids, mbs = epoch_rows(src)
    for mb in mbs:
        for k, v in data.items():
            assert np.array_equal(mb[k], v[mb.indices]), k
    return ids


def test_every_source_kind_gives_the_same_minibatches(tmp_path, data):
    da = pytest.importorskip("dask.array")
    for k, v in data.items():
        np.save(tmp_path / f"{k}.npy", v)
    kw = dict(batch_size=10, seed=3, window=2, prefetch=0)
    mem = MinibatchSource(data, chunk_size=16, **kw)
    npy = MinibatchSource.from_npy(
        {k: tmp_path / f"{k}.npy" for k in data}, chunk_bytes=16 * (16 + 8), **kw
    )
    dsk = MinibatchSource.from_dask({k: da.from_array(v, chunks=16) for k, v in data.items()}, **kw)
    assert mem.source.chunk_sizes == npy.source.chunk_sizes == dsk.source.chunk_sizes
    orders = [check_matches(s, data) for s in (mem, npy, dsk)]
    assert np.array_equal(orders[0], orders[1]) and np.array_equal(orders[0], orders[2])


def test_npy_shards_are_concatenated_and_checked(tmp_path, data):
    x, y = data["features"], data["labels"]
    paths = []
    for i, part in enumerate(np.array_split(x, 3)):
        paths.append(tmp_path / f"x{i}.npy")
        np.save(paths[-1], part)
    np.save(tmp_path / "y.npy", y)
    src = MinibatchSource.from_npy(
        {"features": paths, "labels": tmp_path / "y.npy"},
        chunk_bytes=200,
        batch_size=7,
        prefetch=0,
    )
    check_matches(src, data)
    np.save(tmp_path / "bad.npy", np.zeros((5, 3), np.float32))
    with pytest.raises(ValueError, match=r"holds samples of shape \(3,\)"):
        NpySource({"features": [paths[0], tmp_path / "bad.npy"]})
    with pytest.raises(ValueError, match="'labels' has 5 samples but field 'features' has 103"):
        NpySource({"features": paths, "labels": tmp_path / "bad.npy"})


def test_fields_of_different_lengths_are_refused(data):
    with pytest.raises(ValueError, match="'labels' has 50 samples but field 'features' has 103"):
        MinibatchSource({"features": data["features"], "labels": data["labels"][:50]})
    with pytest.raises(TypeError, match="dict of arrays or a Source"):
        MinibatchSource([1, 2, 3])


def test_dask_chunks_are_computed_only_when_needed():
    da = pytest.importorskip("dask.array")
    computed = []

    def mark(block, block_info=None):
        computed.append(block_info[0]["chunk-location"][0])
        return block

    x = da.arange(100, chunks=10).map_blocks(mark, dtype=np.int64)
    src = MinibatchSource.from_dask({"x": x}, batch_size=5, window=1, shuffle=False, prefetch=0)
    mb = src.next_minibatch()
    assert mb["x"].tolist() == [0, 1, 2, 3, 4]
    assert set(computed) == {0}


class Failing:
    """A custom source (the protocol) whose chunk 3 cannot be read."""

    names = ("x",)
    chunk_sizes = [4] * 6

    def read_chunk(self, i):
        if i == 3:
            raise OSError("disk on fire")
        return {"x": np.arange(4 * i, 4 * i + 4)}


def test_reader_errors_reach_the_consumer_after_earlier_batches():
    src = MinibatchSource(Failing(), batch_size=4, shuffle=False, window=1, prefetch=2)
    got = []
    with pytest.raises(OSError, match="disk on fire"):
        for mb in src:
            got.append(mb["x"].tolist())
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    with pytest.raises(OSError, match="disk on fire"):
        for _ in range(10):
            src.next_minibatch()


def test_bad_chunks_from_a_custom_source_get_a_clear_error():
    class Short(Failing):
        def read_chunk(self, i):
            return {"x": np.arange(3)}

    with pytest.raises(ValueError, match="chunk 0 of field 'x' has .* samples, expected 4"):
        list(MinibatchSource(Short(), batch_size=4, prefetch=0))


def test_close_stops_the_prefetch_threads(data):
    before = threading.active_count()
    src = MinibatchSource(data, batch_size=2, prefetch=3)
    it = iter(src)
    next(it)
    src.next_minibatch()
    assert threading.active_count() >= before + 2
    src.close()
    assert threading.active_count() == before
    with pytest.raises(StopIteration):
        next(it)


def test_prefetcher_stops_a_producer_blocked_on_a_full_queue():
    made = []

    def produce():
        for i in range(10**6):
            made.append(i)
            yield i

    p = Prefetcher(produce, depth=2)
    assert next(p) == 0
    deadline = time.monotonic() + 5
    while len(made) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    p.close()
    assert not p.alive
    assert len(made) <= 5  # it stayed at most `depth` (+ one in hand) ahead
    with pytest.raises(ValueError, match="depth"):
        Prefetcher(produce, depth=0)


def test_prefetch_does_not_change_the_data(data):
    a = [mb["labels"].tolist() for mb in MinibatchSource(data, 8, seed=2, prefetch=0)]
    b = [mb["labels"].tolist() for mb in MinibatchSource(data, 8, seed=2, prefetch=4)]
    assert a == b


def test_next_minibatch_reads_on_across_epochs(data):
    src = MinibatchSource(data, batch_size=8, seed=4, chunk_size=10, window=3, prefetch=2)
    e0, _ = epoch_rows(src, 0)
    e1, _ = epoch_rows(src, 1)
    sizes = [5, 8, 30, 1, 50, 13, 40]
    mbs = [src.next_minibatch(n) for n in sizes]
    assert [mb.num_samples for mb in mbs] == sizes
    assert np.array_equal(
        np.concatenate([mb.indices for mb in mbs]), np.concatenate([e0, e1])[:147]
    )
    for mb in mbs:
        assert np.array_equal(mb["features"], data["features"][mb.indices])
    # An epoch is 104 samples (103 + one pad), the 104th is in the 6th minibatch (94..106).
    assert len(e0) == 104
    assert [mb.sweep_end for mb in mbs] == [False] * 5 + [True, False]
    assert [mb.epoch for mb in mbs] == [0] * 6 + [1]
    assert mbs[5].pad == 1 and mbs[5].padding[103 - 94]
    src.close()


def test_cpu_device_placement(data):
    from labkv.devices import cpu, device_of

    src = MinibatchSource(data, 8, to_device=cpu(1), prefetch=1)
    mb = next(iter(src))
    assert device_of(mb["features"]) == cpu(1)
    assert device_of(src.next_minibatch(3)["labels"]) == cpu(1)
    src.close()


@pytest.mark.gpu
def test_gpu_device_placement(data):
    from labkv.devices import gpu, is_cupy, num_gpus

    if num_gpus() < 1:
        pytest.skip("no CUDA GPU with CuPy")
    src = MinibatchSource(data, 8, to_device=gpu(0))
    mb = next(iter(src))
    assert is_cupy(mb["features"]) and mb["features"].shape == (8, 4)
    assert np.array_equal(mb["labels"].get(), mb.indices)
    src.close()


def test_memory_stays_within_the_window_not_the_file(tmp_path):
    # 16 MiB on disk, 128 KiB chunks, window of 2 chunks: what a reader holds at
    # once should be a few chunks, far below the file (tracemalloc sees numpy;
    # reading it all at once peaks above 16 MiB).
    rows, dim = 4096, 1024
    path = tmp_path / "big.npy"
    big = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, dim))
    for i in range(0, rows, 512):
        big[i : i + 512] = i
    big.flush()
    del big
    src = MinibatchSource.from_npy(
        {"x": path}, batch_size=16, chunk_bytes=128 << 10, window=2, prefetch=2
    )
    assert len(src.source.chunk_sizes) == 128
    tracemalloc.start()
    try:
        n = 0
        for mb in src:
            n += mb.num_samples
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == rows
    assert peak < 4 << 20, f"peak {peak / 2**20:.1f} MiB while reading a 16 MiB file"


def test_dropping_an_unfinished_epoch_stops_its_thread(data):
    import gc

    before = threading.active_count()
    src = MinibatchSource(data, batch_size=2, prefetch=2)
    it = iter(src)
    next(it)
    del it
    gc.collect()
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle,window", [(False, None), (True, None), (True, 2)])
def test_the_minibatch_of_a_step_is_the_one_the_epochs_give(shuffle, window, drop_last):
    """``minibatch_at(n)`` read alone equals the n-th minibatch of the epochs
    read in order (samples, ids, padding, epoch, step), on every rank, across
    epochs: what a replayed step reads."""
    data = {"x": np.arange(23 * 2).reshape(23, 2), "y": np.arange(23)}
    for rank in range(3):
        kw = dict(batch_size=3, shuffle=shuffle, window=window, seed=5, rank=rank)
        src = MinibatchSource(
            data, num_workers=3, drop_last=drop_last, prefetch=0, chunk_size=4, **kw
        )
        epochs = [mb for _ in range(3) for mb in src]
        for n, want in enumerate(epochs):
            got = src.minibatch_at(n)
            for name in ("x", "y"):
                np.testing.assert_array_equal(got[name], want[name])
            np.testing.assert_array_equal(got.indices, want.indices)
            np.testing.assert_array_equal(got.padding, want.padding)
            assert (got.epoch, got.step, got.sweep_end) == (want.epoch, want.step, want.sweep_end)


def test_a_step_that_is_not_a_count_is_refused():
    src = MinibatchSource({"y": np.arange(8)}, batch_size=2, prefetch=0)
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="step must be a non-negative int"):
            src.minibatch_at(bad)


def test_set_epoch_makes_the_next_loop_read_that_epoch_as_a_fresh_source_would(data):
    """Resuming at epoch 2: the loop reads what the third loop of a source that
    never stopped reads, and the loop after it epoch 3."""
    fresh = MinibatchSource(data, batch_size=8, seed=5, chunk_size=10, window=2, prefetch=0)
    loops = [[mb.indices.tolist() for mb in fresh] for _ in range(4)]
    assert loops[2] != loops[1]  # the epochs differ: the check can fail
    resumed = MinibatchSource(data, batch_size=8, seed=5, chunk_size=10, window=2, prefetch=0)
    resumed.set_epoch(2)
    assert resumed.epoch == 2
    assert [mb.indices.tolist() for mb in resumed] == loops[2]
    assert resumed.epoch == 3
    assert [mb.indices.tolist() for mb in resumed] == loops[3]
