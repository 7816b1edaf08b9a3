"""Machine facts the core reads: the load average recorded beside speed figures."""

from __future__ import annotations


def test_load_average_is_the_os_figure_or_none(monkeypatch):
    import os

    from core.device import load_average

    load = load_average()
    assert load is None or (len(load) == 3 and all(x >= 0 for x in load))

    def missing():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", missing)
    assert load_average() is None
