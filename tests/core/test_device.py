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


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/clear_refs"), reason="Linux only")
def test_the_cpu_peak_holds_memory_freed_before_it_is_read():
    """Sampled after each step, the CPU peak missed the activations and gradients freed within it (15-22%)."""
    import numpy as np
    import torch

    from core.device import memory_gib, peak_memory_gib, reset_peak_memory

    cpu = torch.device("cpu")
    assert reset_peak_memory(cpu)
    before = memory_gib(cpu)
    block = np.ones(256 * 2**20, dtype=np.uint8)  # 256 MiB, touched
    del block
    assert memory_gib(cpu) < before + 0.1  # gone again: a sample now sees nothing of it
    assert peak_memory_gib(cpu) >= before + 0.24
    assert reset_peak_memory(cpu) and peak_memory_gib(cpu) < before + 0.1
