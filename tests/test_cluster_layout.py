"""The shape of ``labkv/cluster`` (``docs/design.md``, "Map of labkv/cluster"),
checked from the source: the rooms import one way (driver -> rank | server ->
transport -> protocol and the shared bottom), rank and server never import each
other, and only the Dask adapter and the driver import Dask."""

from __future__ import annotations

from tests import _layout


def test_the_rooms_import_one_way_and_only_the_adapter_and_the_driver_import_dask():
    assert _layout.violations() == []


def test_the_check_sees_a_forbidden_import(tmp_path, monkeypatch):
    """The check reads every import, in functions too: a server module that
    imports the rank's store, and a rank module that imports distributed, are both
    found (the rules of the check are not vacuous)."""
    cluster = tmp_path / "labkv" / "cluster"
    for folder in ("_rank", "_server"):
        (cluster / folder).mkdir(parents=True)
        (cluster / folder / "__init__.py").write_text("")
    (cluster / "__init__.py").write_text("")
    (cluster / "_rank" / "dist_store.py").write_text("def f():\n    import distributed\n")
    (cluster / "_server" / "actor.py").write_text("from .._rank.dist_store import f\n")
    monkeypatch.setattr(_layout, "CLUSTER", cluster)
    found = _layout.violations()
    assert len(found) == 2, found
    assert any(
        "_server/actor.py:1 (_server) imports labkv.cluster._rank.dist_store" in v for v in found
    )
    assert any("_rank/dist_store.py:2 imports distributed" in v for v in found)
    (cluster / "_rank" / "calls.py").write_text("def g():\n    from .dist_store import f\n")
    (cluster / "_rank" / "dist_store.py").write_text("from .calls import g\n")
    assert _layout.cycles() == [
        ["labkv.cluster._rank.calls", "labkv.cluster._rank.dist_store", "labkv.cluster._rank.calls"]
    ]


def test_no_import_circles_even_through_imports_inside_functions():
    assert _layout.cycles() == []


def test_no_module_of_labkv_over_500_lines_of_code():
    assert _layout.too_long() == []


def test_the_server_and_the_store_are_composed_not_mixed():
    """``Server`` has no base class; ``DistStore`` only the public ``KVStore``
    (the store API it implements)."""
    assert _layout.bases("Server") == {"labkv.cluster._server.actor": []}
    assert _layout.bases("DistStore") == {"labkv.cluster._rank.dist_store": ["KVStore"]}


def test_no_module_probes_a_link_or_a_future():
    assert _layout.probes() == []


def test_the_shape_checks_see_what_they_forbid(tmp_path, monkeypatch):
    cluster = tmp_path / "labkv" / "cluster"
    (cluster / "_rank").mkdir(parents=True)
    (cluster / "_rank" / "dist_store.py").write_text(
        '"""A docstring\n' + "of many lines\n" * 300 + '"""\n\n# a comment\n'
        "class DistStore(Streaming, KVStore):\n    pass\n"
        + "x = getattr(link, 'replicated', False)\n"
        * 499
    )
    (cluster / "_rank" / "calls.py").write_text('"""Docs only."""\n' + "# comment\n" * 600)
    monkeypatch.setattr(_layout, "CLUSTER", cluster)
    assert _layout.too_long() == ["labkv/cluster/_rank/dist_store.py: 501 lines of code"]
    assert _layout.bases("DistStore") == {
        "labkv.cluster._rank.dist_store": ["Streaming", "KVStore"]
    }
    assert len(_layout.probes()) == 499


def test_no_module_name_appears_twice_in_labkv():
    """One name per module in all of ``labkv/`` (``_log`` and ``log`` are one
    name): a name says which module, without its folder."""
    assert _layout.repeated_names() == {}


def test_no_import_circles_anywhere_in_labkv():
    """No circle among all of ``labkv/``'s modules, counting imports inside
    functions (type-only imports aside); ``from pkg import name`` is an edge to
    the package's ``__init__`` unless ``name`` is a submodule."""
    assert _layout.labkv_cycles() == []


def test_the_name_and_circle_checks_see_what_they_forbid(tmp_path, monkeypatch):
    labkv = tmp_path / "labkv"
    for folder in ("cluster", "events", "widgets"):
        (labkv / folder).mkdir(parents=True)
    (labkv / "__init__.py").write_text("")
    (labkv / "cluster" / "__init__.py").write_text("")
    (labkv / "_log.py").write_text("")
    (labkv / "cluster" / "log.py").write_text("")
    # a package whose __init__ imports a part that, in a function, takes a
    # name from the __init__: a circle; importing a sibling submodule is not
    (labkv / "events" / "__init__.py").write_text("from ._trace import f\nX = 1\n")
    (labkv / "events" / "_trace.py").write_text(
        "from . import _tally\n\ndef f():\n    from . import X\n    return X\n"
    )
    (labkv / "events" / "_tally.py").write_text("")
    monkeypatch.setattr(_layout, "CLUSTER", labkv / "cluster")
    monkeypatch.setattr(_layout, "LABKV", labkv)
    assert _layout.repeated_names() == {"log": ["labkv/_log.py", "labkv/cluster/log.py"]}
    assert _layout.labkv_cycles() == [
        ["labkv.events.__init__", "labkv.events._trace", "labkv.events.__init__"]
    ]
