"""The ``speedboard`` command: the engine's commands (``core.cli``), the benchmark (``bench``)
and the dashboard (``gui``).

It is the one place that depends on all three, so the engine never imports a front end.
"""
