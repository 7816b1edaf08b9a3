"""torchrun entry for the fault test: ``speedboard train``, except that one rank dies mid-run.

``SPEEDBOARD_TEST_DIE_AT=RANK:STEP`` makes that rank exit abruptly (no clean-up,
as a crash or an out-of-memory kill would) when it starts that optimizer step.
"""

from __future__ import annotations

import os
import sys

from core import cli
from core.trainer import Trainer

_rank, _step = (int(x) for x in os.environ["SPEEDBOARD_TEST_DIE_AT"].split(":"))
_original_step = Trainer._optimizer_step


def _dying_step(self):
    if self.dist.rank == _rank and self.step + 1 == _step:
        print(f"rank {_rank}: simulated crash at step {_step}", file=sys.stderr, flush=True)
        os._exit(17)
    return _original_step(self)


Trainer._optimizer_step = _dying_step

if __name__ == "__main__":
    sys.exit(cli.main())
