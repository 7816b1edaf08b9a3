"""Thread-safe commands from the GUI (or any thread) to a running trainer.

The trainer polls this object between optimizer steps; nobody ever blocks the
caller. Pausing blocks only the trainer's own thread, and a stop request wakes
it up again.
"""

from __future__ import annotations

import threading


class Control:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._running = threading.Event()  # cleared while paused
        self._running.set()
        self._save_requests: list[str | None] = []

    # --- called from any thread -------------------------------------------------
    def stop(self) -> None:
        """End the run after the current optimizer step (a final checkpoint is saved)."""
        self._stop.set()
        self._running.set()  # wake a paused trainer so it can stop

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def request_save(self, path: str | None = None) -> None:
        """Save a checkpoint at the next optimizer step, to ``path`` or the run's own folder."""
        with self._lock:
            self._save_requests.append(path)

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    # --- called by the trainer --------------------------------------------------
    def take_save_requests(self) -> list[str | None]:
        with self._lock:
            requests, self._save_requests = self._save_requests, []
        return requests

    def wait_while_paused(self, timeout: float | None = None) -> bool:
        """Block the trainer's thread while paused; return False if still paused after ``timeout``."""
        return self._running.wait(timeout)
