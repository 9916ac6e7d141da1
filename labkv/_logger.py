"""labkv's logger: one record per lifecycle step of a cluster, so that scripts,
CI logs and notebooks see them where Python's logging sends them.

``logging.getLogger("labkv")`` (and its children) record: a store's servers
started, labkv uploaded to a cluster, the cluster check passed or failed, a
server failed over to its backup, a replica re-seeded, a rank lost, replaced
or dropped. Losses are warnings, the rest ``INFO``. As a library, labkv only
records: its logger has a ``NullHandler``, so nothing is printed until the
application configures logging (``logging.basicConfig(level=logging.INFO)``
shows every record; a notebook that expects a failover shows none of them
under its cells, and the error that matters is raised where a call breaks).
A rank's records,
made on a Dask worker, reach the process that called ``connect`` as Dask
forwards its own (``Client.forward_logging("labkv")``, set up by ``connect``).

>>> import logging
>>> logger.name, logging.getLogger("labkv") is logger
('labkv', True)
"""

from __future__ import annotations

import logging

__all__ = ["logger"]

logger = logging.getLogger("labkv")
logger.addHandler(logging.NullHandler())  # Python's advice for libraries: no output of ours
