"""The distributed store on Dask (server shards on Dask workers)."""

from __future__ import annotations

from typing import Any


def create_store(kind: str, **kwargs: Any) -> Any:
    """Make a ``dist_*`` store (not available yet in this version)."""
    raise NotImplementedError(f"the {kind!r} store needs the Dask cluster backend")
