"""CNTK Text Format: dense, sparse and sequence samples, chunking, error messages."""

from __future__ import annotations

import numpy as np
import pytest

from labkv.data import CTFFormatError, CTFSource, MinibatchSource

STREAMS = {"features": {"dim": 3}, "labels": {"dim": 4, "sparse": True}}


def write(tmp_path, text, name="d.ctf"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def read_all(source):
    parts = [source.read_chunk(i) for i in range(len(source.chunk_sizes))]
    return {k: np.concatenate([p[k] for p in parts]) for k in source.names}


def test_dense_and_sparse_fields(tmp_path):
    path = write(
        tmp_path,
        "|features 1 2 3 |labels 0:1\n"
        "|labels 3:0.5 1:2\t|features\t4 5.5 -6e0   \n"
        "\n"  # blank lines are skipped
        "|features 7 8 9 |# a comment |labels 2:1 |other 1 2\n",
    )
    s = CTFSource(path, STREAMS)
    assert not s.sequences and s.chunk_sizes == [3]
    got = read_all(s)
    assert got["features"].dtype == np.float32
    assert got["features"].tolist() == [[1, 2, 3], [4, 5.5, -6], [7, 8, 9]]
    assert got["labels"].tolist() == [[1, 0, 0, 0], [0, 2, 0, 0.5], [0, 0, 1, 0]]


def test_field_names_and_dtype_can_differ_from_stream_names(tmp_path):
    path = write(tmp_path, "|x 1 2 3 |y 0:1\n|x 4 5 6 |y 1:1\n")
    s = CTFSource(
        path,
        {
            "features": {"field": "x", "shape": 3, "dtype": "float64"},
            "labels": {"field": "y", "dim": 2, "is_sparse": True},
        },
    )
    got = read_all(s)
    assert got["features"].dtype == np.float64
    assert got["labels"].argmax(1).tolist() == [0, 1]


def test_sequences_are_grouped_by_id_and_padded_with_a_mask(tmp_path):
    path = write(
        tmp_path,
        "7 |features 1 1 1 |labels 1:1\n"
        "7 |features 2 2 2\n"
        "3 |features 3 3 3 |labels 0:1\n"
        "7 |features 4 4 4 |labels 2:1\n"  # same id, not consecutive: a new sequence
        "7 |features 5 5 5\n"
        "7 |features 6 6 6\n",
    )
    src = MinibatchSource.from_ctf(path, STREAMS, batch_size=3, shuffle=False, prefetch=0)
    assert src.source.sequences and src.num_samples == 3
    (mb,) = list(src)
    assert mb["features"].shape == (3, 3, 3)
    assert mb.mask["features"].tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1]]
    assert mb["features"][:, :, 0].tolist() == [[1, 2, 0], [3, 0, 0], [4, 5, 6]]
    assert mb["labels"].shape == (3, 1, 4)
    assert mb["labels"][:, 0].argmax(1).tolist() == [1, 0, 2]
    with pytest.raises(ValueError, match="sequences=False but line 2"):
        CTFSource(path, STREAMS, sequences=False)


def test_small_chunks_read_the_same_samples_and_cut_between_sequences(tmp_path):
    rng = np.random.default_rng(0)
    lines, seqs = [], []
    for sid in range(60):
        n = int(rng.integers(1, 4))
        seqs.append(n)
        lines += [f"{sid} |features {sid} {t} 0 |labels {t % 4}:1" for t in range(n)]
    path = write(tmp_path, "\n".join(lines) + "\n")
    one = CTFSource(path, STREAMS)
    many = CTFSource(path, STREAMS, chunk_bytes=100)
    assert len(many.chunk_sizes) > 10 and sum(many.chunk_sizes) == 60
    a, b = read_all(one), read_all(many)
    for k in STREAMS:
        assert [x.tolist() for x in a[k]] == [x.tolist() for x in b[k]]
    assert [len(x) for x in b["features"]] == seqs
    assert [x[0, 0] for x in b["features"]] == list(range(60))


def test_file_without_trailing_newline_and_crlf(tmp_path):
    path = tmp_path / "d.ctf"
    path.write_bytes(b"|features 1 2 3 |labels 0:1\r\n|features 4 5 6 |labels 1:1")
    got = read_all(CTFSource(str(path), STREAMS))
    assert got["features"][:, 0].tolist() == [1, 4]


BAD = [
    ("|features 1 2 |labels 0:1", 2, "expected 3 dense values, got 2"),
    ("|features 1 2 x |labels 0:1", 2, "expected numbers"),
    ("|features 1 2 3 |labels 2", 2, "expected index:value, got '2'"),
    ("|features 1 2 3 |labels 4:1", 2, r"sparse index 4 out of range \[0, 4\)"),
    ("|features 1 2 3 |labels a:1", 2, "expected numbers"),
    ("|features 1 2 3", 2, r"expected field \|labels \(dim 4\), not found"),
    ("|features 1 2 3 |features 1 2 3 |labels 0:1", 2, "appears twice"),
    ("x |features 1 2 3 |labels 0:1", 2, "expected a sequence id"),
    ("features 1 2 3", 2, "expected '|'"),
    ("| 1 2 3", 2, "expected a field name"),
]


@pytest.mark.parametrize(("line", "lineno", "message"), BAD)
def test_malformed_lines_name_file_line_and_expectation(tmp_path, line, lineno, message):
    good = "|features 0 0 0 |labels 0:1"
    path = write(tmp_path, f"{good}\n{line}\n{good}\n")
    with pytest.raises(CTFFormatError, match=message) as err:
        read_all(CTFSource(path, STREAMS))
    assert str(err.value).startswith(f"{path}:{lineno}: ")
    assert (err.value.path, err.value.line) == (path, lineno)


def test_errors_in_later_chunks_have_the_right_line_number(tmp_path):
    lines = ["|features 1 2 3 |labels 0:1"] * 500
    lines[437] = "|features 1 2 3 |labels 9:1"
    path = write(tmp_path, "\n".join(lines))
    src = MinibatchSource.from_ctf(path, STREAMS, chunk_bytes=256, batch_size=10, shuffle=False)
    with pytest.raises(CTFFormatError, match=r":438: field \|labels: sparse index 9"):
        for _ in src:  # the error is raised in the prefetch thread and re-raised here
            pass


def test_empty_file_and_bad_stream_specs(tmp_path):
    with pytest.raises(ValueError, match="no samples"):
        CTFSource(write(tmp_path, "\n  \n"), STREAMS)
    path = write(tmp_path, "|x 1\n", "ok.ctf")
    with pytest.raises(ValueError, match="'dim' must be a positive int"):
        CTFSource(path, {"x": {"dim": 0}})
    with pytest.raises(ValueError, match="unknown keys"):
        CTFSource(path, {"x": {"dim": 1, "spares": True}})
    with pytest.raises(ValueError, match="at least one stream"):
        CTFSource(path, {})
