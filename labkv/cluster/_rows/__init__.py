"""Row-sparse keys on the cluster: only the rows touched travel.

A key initialised with a :class:`~labkv.sparse.RowSparseArray` is cut by contiguous
row ranges over every server, as MXNet does (:mod:`.placement`), and each server
keeps its rows as a dense ``(rows, ...)`` piece. A rank's row-sparse push sends each
server only its rows, numbered within the server's range (``PushHeader.rows``); a
``row_sparse_pull`` asks each server only for the requested rows it holds
(``Pull.rows``), for dense keys too (:mod:`.rank`). The server turns the rows that
arrive back into a :class:`~labkv.sparse.RowSparseArray` of its piece, so the
``Shard`` sums and updates them as the local store does (lazy updates included), and
reads the rows a pull asks for (:mod:`.server`). The shared bottom of the cluster:
both the rank and the server import it.
"""
