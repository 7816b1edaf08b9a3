"""``python -m speedboard``: the ``speedboard`` command."""

import os
import sys


def _working_folder_last() -> None:
    """``python -m`` puts the working folder first on the import path, where a folder of the user's own named
    ``core/`` or ``gui/`` would hide Speedboard's packages; the console script has its own folder there instead."""
    if sys.flags.safe_path or not sys.path or os.path.abspath(sys.path[0] or os.curdir) != os.getcwd():
        return
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder holding speedboard/ and core/
    if ours == os.getcwd():
        return  # run from the checkout itself: the working folder is ours
    del sys.path[0]
    if ours not in (os.path.abspath(p or os.curdir) for p in sys.path):
        sys.path.insert(0, ours)


_working_folder_last()

from speedboard.cli import entry  # noqa: E402 - after the import path is settled

sys.exit(entry())
