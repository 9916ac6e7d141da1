"""The monitor's model: what the views show, folded from a store's events, in pure
Python (no ipywidgets, no bokeh), so it works in scripts and tests:
:mod:`.monitor_model` (``MonitorModel``), the records it keeps per key, round and
server (:mod:`.records`) and two of its folds (:mod:`.folds`)."""
