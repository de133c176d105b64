"""Stop requests. SIGTERM, SIGINT or SIGUSR2 on ANY rank only sets a flag here; the flag travels in
the optimizer-boundary all-reduce (align.control.boundary), so every rank stops after the same
optimizer step, writes the stop checkpoint and exits 143 (docs/pitfalls.md#13: torchrun forwards SIGTERM to
every worker; submitit sends SIGUSR2 to rank 0 only).

`align.train` holds them for the whole job, start-up included: inside `at_once()` (start-up, before
the first step, when there is nothing to finish or save) a stop signal raises StopRequested at once,
so the run still completes its manifest and exit record (exit 143) instead of dying mid-start."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Any, Iterator, Optional

from align.errors import StopRequested

log = logging.getLogger("align")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)


class StopSignals:
    """While entered, the stop signals set `reason` instead of killing the process. A second SIGINT
    raises KeyboardInterrupt (a human pressing Ctrl-C twice means now). Once a stop was requested the
    handlers stay after the block, so the process can finish its bookkeeping and exit 143."""

    def __init__(self) -> None:
        self.reason: Optional[str] = None
        self._previous: dict[int, Any] = {}
        self._depth = 0  # nested entries (the job's, then fit()'s): only the outermost installs and restores
        self._at_once = False

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def request(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            log.warning("stop requested (%s): finishing this optimizer step, then checkpoint and exit 143", reason)

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.reason is not None:
            raise KeyboardInterrupt
        name = signal.Signals(signum).name
        if self._at_once:
            self.reason, self._at_once = name, False  # a second signal must not cut the unwinding short
            raise StopRequested(f"stop requested ({name}) during start-up, before the first optimizer step: "
                                "nothing to save; the run resumes from where it was")
        self.request(name)

    @contextlib.contextmanager
    def at_once(self) -> Iterator[None]:
        """Start-up: a stop signal raises StopRequested where it lands instead of waiting for a boundary
        (one that landed before the block raises on entry)."""
        if self.reason is not None:
            raise StopRequested(f"stop requested ({self.reason}) during start-up, before the first optimizer step: "
                                "nothing to save; the run resumes from where it was")
        self._at_once = True
        try:
            yield
        finally:
            self._at_once = False

    def __enter__(self) -> "StopSignals":
        self._depth += 1
        if self._depth > 1:
            return self
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        else:
            log.warning("not the main thread: stop signals are not intercepted")
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if self._depth:
            return
        # After a coordinated stop the process still writes its manifest and exit record; a launcher
        # that signals the survivors again (torchrun does, once one rank exits) must not cut that short.
        if self.reason is None:
            for s, h in self._previous.items():
                signal.signal(s, h)
        self._previous.clear()
