"""The Speedboard dashboard (PySide6 + pyqtgraph).

pyqtgraph picks whichever Qt binding is already imported, so PySide6 is imported
here, before any module of this package imports pyqtgraph.
"""

import os
import sys

os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")

import PySide6  # noqa: E402
import PySide6.QtCore  # noqa: E402,F401  (the binding pyqtgraph must use)

if sys.version_info < (3, 12) and PySide6.__version__ == "6.12.0":
    # It drops a reference to None on every call of a void method: on Python 3.11 the
    # window aborts within minutes of plotting ("Fatal Python error: deallocating None").
    raise ImportError("PySide6 6.12.0 crashes on Python 3.11; install another version: "
                      "pip install 'PySide6-Essentials>=6.6,!=6.12.0'")
