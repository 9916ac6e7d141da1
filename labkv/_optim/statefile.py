"""Optimizer-state files: arrays in an ``.npz``, everything else as JSON inside it.

Loading never runs code, and reads only what it checked: :class:`StateFile`
opens the zip itself, reads a member only when asked for it by name, checks
its ``.npy`` header (shape, a float dtype) before its data and refuses a
member whose size on disk or unpacked exceeds what that header needs (a small
file can hold a huge deflated member), with ``allow_pickle=False`` and
``json`` only. Every refusal is a ``ValueError`` naming the file and what is
wrong, never numpy's hint to load with ``allow_pickle``. The file is written to exactly the given name (no ``.npz`` is added),
atomically: into a temporary file in the same folder, flushed to disk, then
renamed over the name. A save that fails (a full disk) or is killed leaves the
previous file exactly as it was, so the last good checkpoint is never lost.
A killed save leaves its temporary (``.<name>.<hex>.tmp``) behind; the next
save of the same name removes it (never a live save's: see
:func:`remove_stale_temporaries`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..devices import is_cupy

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: stale temporaries are kept
    fcntl = None  # type: ignore[assignment]

FORMAT = "labkv-optimizer-states/1"
_META = "__meta__"


def encode_key(key: int | str) -> list:
    """A key as JSON that keeps its type: ``[\"int\", 3]`` or ``[\"str\", \"w\"]``."""
    return ["int", key] if isinstance(key, int) else ["str", key]


def save(path: str | os.PathLike, meta: dict[str, Any], arrays: dict[str, Any]) -> None:
    """Write ``meta`` (JSON-able) and named arrays (numpy or CuPy) to ``path``."""
    host = {name: (a.get() if is_cupy(a) else np.asarray(a)) for name, a in arrays.items()}
    blob = json.dumps({"format": FORMAT, **meta}).encode()
    with atomic_write(path) as f:
        np.savez(f, **{_META: np.frombuffer(blob, dtype=np.uint8)}, **host)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Any:
    """A binary file that replaces ``path`` only once it is wholly written
    and on disk; on an error ``path`` is left as it was (see module doc).
    The temporaries of earlier saves of ``path`` that were killed midway are
    removed first (:func:`remove_stale_temporaries`).

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "states"
    >>> with atomic_write(target) as f:
    ...     _ = f.write(b"new")
    >>> target.read_bytes()
    b'new'
    """
    target = Path(path)
    remove_stale_temporaries(target)
    tmp, fd = _locked_temporary(target)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileNotFoundError):  # an overwritten file keeps its mode
            os.chmod(tmp, target.stat().st_mode & 0o7777)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)  # releases the lock, after the rename
    with contextlib.suppress(OSError):  # the rename itself on disk (not on every filesystem)
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


# A save's temporary is ".<name>.<12 hex digits>.tmp", beside the file, and
# locked (flock) by its writer from creation to rename. Why a lock, not a pid
# or an age in the name: the kernel drops a lock when its holder dies, even by
# SIGKILL, and only then; a pid can be reused or belong to another host (a
# checkpoint folder shared over NFS, a container's pid namespace), and an age
# cannot tell a slow save of a big checkpoint from a dead one.
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{12}\.tmp")


def _locked_temporary(target: Path) -> tuple[Path, int]:
    """A new temporary of ``target``, created and locked: its path and fd."""
    while True:
        tmp = target.parent / f".{target.name}.{uuid.uuid4().hex[:12]}.tmp"
        # 0o666 as open() uses: the kernel applies the umask, as for a plain save.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        if fcntl is None:
            return tmp, fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # Between the create and the lock another save may have taken the
            # file for a dead one's and removed it: then start again.
            if os.fstat(fd).st_nlink > 0:
                return tmp, fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Remove the temporaries that saves of ``path`` left when they were
    killed (their writer's lock is gone); the removed paths. A temporary that a
    live save, in any process, is writing is locked and kept, as is every
    other file. Without ``fcntl`` (Windows) nothing is removed.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / ".states.0123456789ab.tmp").write_bytes(b"killed")
    >>> _ = (folder / ".states.mine.tmp").write_bytes(b"not a save's")
    >>> [p.name for p in remove_stale_temporaries(folder / "states")]
    ['.states.0123456789ab.tmp']
    >>> sorted(p.name for p in folder.iterdir())
    ['.states.mine.tmp']
    """
    target = Path(path)
    if fcntl is None:
        return []
    try:
        names = os.listdir(target.parent)
    except OSError:
        return []  # the save itself reports a missing folder
    removed = []
    for name in names:
        match = _TEMPORARY.fullmatch(name)
        if match is None or match["name"] != target.name:
            continue
        stale = target.parent / name
        try:
            # Read-write: over NFS an exclusive flock needs a file open for writing.
            fd = os.open(stale, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue  # renamed or removed meanwhile, or not ours to open
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # Still the file we locked (not renamed over by its finished save)?
            if os.path.samestat(os.fstat(fd), os.stat(stale, follow_symlinks=False)):
                os.unlink(stale)
                removed.append(stale)
        except OSError:
            pass  # locked: a live save's; or gone meanwhile
        finally:
            os.close(fd)
    return removed


#: The largest metadata member read (its JSON: keys, counts, optimizer settings).
MAX_META_BYTES = 16 << 20
#: What an array member may hold beyond its data: the .npy header.
_HEADER_SLACK = 1 << 16


class StateFileError(ValueError):
    """A state file that cannot be loaded: the message names the file and why."""


class StateFile:
    """An optimizer-state file opened for checked reading (a context manager):
    ``meta`` is its JSON; :meth:`array` reads one member, checked.

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "states"
    >>> save(path, {"keys": []}, {"s0_0": np.ones(3, np.float32)})
    >>> with StateFile(path) as f:
    ...     f.meta["keys"], f.array("s0_0", (3,))
    ([], array([1., 1., 1.], dtype=float32))
    >>> with StateFile(path) as f:
    ...     f.array("s0_0", (4,))
    Traceback (most recent call last):
    ...
    labkv._optim.statefile.StateFileError: ...: member 's0_0' holds shape (3,), not (4,)
    """

    def __init__(self, path: str | os.PathLike):
        self.name = repr(os.fspath(path))
        try:
            empty = os.path.getsize(path) == 0
        except OSError as exc:
            raise self.error(f"{exc.strerror or exc}") from None
        if empty:
            raise self.error("the file is empty")
        try:
            self._zip = zipfile.ZipFile(path)
        except (OSError, zipfile.BadZipFile, EOFError, ValueError) as exc:
            raise self.error(f"not a labkv optimizer-state file ({exc})") from None
        try:
            self._members = {i.filename: i for i in self._zip.infolist()}
            raw = self._read(_META + ".npy", MAX_META_BYTES, np.dtype(np.uint8), None)
            try:
                meta = json.loads(raw.tobytes().decode("utf-8"))
            except (ValueError, RecursionError, UnicodeDecodeError) as exc:
                raise self.error(f"its metadata is not JSON ({type(exc).__name__})") from None
            if not isinstance(meta, dict):
                raise self.error("its metadata is not a JSON object")
            if meta.get("format") != FORMAT:
                raise self.error(f"format {meta.get('format')!r}, not {FORMAT}")
            self.meta: dict[str, Any] = meta
        except BaseException:
            self._zip.close()
            raise

    def error(self, why: str) -> StateFileError:
        return StateFileError(f"cannot load optimizer states from {self.name}: {why}")

    def names(self) -> list[str]:
        """The array members other than the metadata, without ``.npy``."""
        return [n[:-4] for n in self._members if n.endswith(".npy") and n != _META + ".npy"]

    def array(self, name: str, shape: tuple[int, ...], label: str = "") -> np.ndarray:
        """Member ``name``: refused unless a float array of exactly ``shape``;
        ``label`` says what it is in the errors (e.g. ``"key 'w', state 0"``)."""
        return self._read(name + ".npy", None, None, tuple(shape), label)

    def _read(
        self,
        member: str,
        max_bytes: int | None,
        dtype: np.dtype | None,
        shape: tuple | None,
        label: str = "",
    ) -> np.ndarray:
        info = self._members.get(member)
        what = f"member {member[:-4]!r}" + (f" ({label})" if label else "")
        if info is None:
            raise self.error(f"{what} is missing")
        try:
            with self._zip.open(info) as f:
                got_shape, fortran, got_dtype = self._header(f, what)
                if got_dtype.hasobject:
                    raise self.error(f"{what} holds Python objects")
                if dtype is not None and got_dtype != dtype:
                    raise self.error(f"{what} has dtype {got_dtype}, not {dtype}")
                if dtype is None and got_dtype.kind != "f":
                    raise self.error(f"{what} has dtype {got_dtype}; states are float arrays")
                if shape is not None and tuple(got_shape) != shape:
                    raise self.error(f"{what} holds shape {tuple(got_shape)}, not {shape}")
                nbytes = int(np.prod(got_shape, dtype=np.int64)) * got_dtype.itemsize
                limit = nbytes + _HEADER_SLACK
                if max_bytes is not None:
                    limit = min(limit, max_bytes)
                if info.file_size > limit or info.compress_size > limit:
                    raise self.error(f"{what} is {info.file_size} bytes, for {nbytes} of data")
                data = f.read(nbytes + 1)
        except StateFileError:
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, RuntimeError) as exc:
            raise self.error(f"{what} cannot be read ({type(exc).__name__}: {exc})") from None
        if len(data) != nbytes:
            raise self.error(f"{what} holds {len(data)} bytes of data, not {nbytes}")
        array = np.frombuffer(data, dtype=got_dtype)
        order = "F" if fortran else "C"
        return array.reshape(got_shape, order=order).copy(order=order)

    def _header(self, f: Any, what: str) -> tuple[tuple, bool, np.dtype]:
        """A member's ``.npy`` header: ``(shape, fortran order, dtype)``."""
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(f)
        if version == (2, 0):
            return np.lib.format.read_array_header_2_0(f)
        raise self.error(f"{what} has .npy version {version}")

    def shape_of(self, name: str) -> tuple[int, ...]:
        """The shape member ``name``'s header declares (nothing else is read)."""
        info = self._members.get(name + ".npy")
        if info is None:
            raise self.error(f"member {name!r} is missing")
        try:
            with self._zip.open(info) as f:
                return tuple(self._header(f, f"member {name!r}")[0])
        except StateFileError:
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, RuntimeError) as exc:
            raise self.error(f"member {name!r} cannot be read ({type(exc).__name__})") from None

    def close(self) -> None:
        self._zip.close()

    def __enter__(self) -> StateFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read a whole file written by :func:`save`: ``(meta, arrays)``, each
    array checked against its own header (see :class:`StateFile`)."""
    with StateFile(path) as f:
        return f.meta, {name: f.array(name, f.shape_of(name)) for name in f.names()}
