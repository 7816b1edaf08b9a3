"""A preparation held at a set moment, to be signalled there: ``python -m tests.core.prepare_signal_entry STAGE ARGS…``.

Runs ``speedboard ARGS…`` with one stage of its data preparation held, as a real corpus holds it for seconds or
minutes, and prints ``STAGE`` on stdout once it is held, for the test to send its signal then:

- ``tokens``: the first batch's encoding (in its worker thread) waits for two minutes, where a batch of 4 Mi
  characters takes seconds;
- ``training``: the tokenizer's training waits inside the Rust trainer (in the Python generator it reads its
  documents from) until the interpreter's shutdown closes a pipe, then goes on: it takes the GIL again while
  Python shuts down, as a training that ends then does.
"""

from __future__ import annotations

import os
import sys
import time

from core import token_store, tokenizer

HELD_S = 120.0

_stage = sys.argv[1]
_read_end, _write_end = os.pipe()
_closed_by_shutdown = os.fdopen(_write_end, "wb")  # a global of __main__: closed as the interpreter clears it


def _held(stage: str) -> None:
    print(stage, flush=True)


if _stage == "tokens":
    _encoder = token_store._encoder

    def _slow_encoder(*args):
        encode = _encoder(*args)

        def encode_slowly(unit):
            _held("tokens")
            time.sleep(HELD_S)
            return encode(unit)

        return encode_slowly

    token_store._encoder = _slow_encoder
elif _stage == "training":
    _short_runs = tokenizer._short_runs
    _waited = []

    def _short_runs_held(text: str) -> str:
        if not _waited:
            _waited.append(True)
            _held("training")
            os.read(_read_end, 1)  # returns once the interpreter's shutdown closes the other end
        return _short_runs(text)

    tokenizer._short_runs = _short_runs_held
else:
    raise SystemExit(f"unknown stage {_stage}")

if __name__ == "__main__":
    from core.cli import main

    sys.exit(main(sys.argv[2:]))
