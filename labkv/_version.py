"""labkv's version, and the number of the wire protocol between its processes.

``PROTOCOL`` changes whenever what ranks, servers and the notebook send each
other changes (a server method's arguments, a message's fields): processes of
one store must all speak the same one. ``tests/test_version.py`` keeps a
fingerprint of the wire and fails when it changes without a new ``PROTOCOL``.
"""

__version__ = "0.14.0"
PROTOCOL = 14
