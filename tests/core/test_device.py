"""Machine facts the core reads: the load average recorded beside speed figures; the devices a name may mean."""

from __future__ import annotations

import pytest


def test_load_average_is_the_os_figure_or_none(monkeypatch):
    import os

    from core.device import load_average

    load = load_average()
    assert load is None or (len(load) == 3 and all(x >= 0 for x in load))

    def missing():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", missing)
    assert load_average() is None


@pytest.mark.parametrize("name", ["bogus", "meta"])
def test_an_unknown_device_is_refused_naming_only_the_devices_present(name, monkeypatch):
    from core import device as dev
    from core.errors import ConfigError

    monkeypatch.setattr(dev, "available_devices", lambda: ["cpu"])
    with pytest.raises(ConfigError) as refused:
        dev.resolve_device(name)
    assert str(refused.value) == f"unknown device {name!r}; use auto or cpu"


def test_a_cpu_index_is_refused_not_ignored():
    from core.device import resolve_device
    from core.errors import ConfigError

    assert resolve_device("cpu:0").type == "cpu"
    with pytest.raises(ConfigError, match="the CPU is one device"):
        resolve_device("cpu:1")
