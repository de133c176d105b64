"""The supervisor: run a training command, relaunch it after a failure while its checkpoints advance.

    python -m align.tools.supervise [--max-no-progress 3] [--backoff 10] -- launchers/torchrun.sh parallel=fsdp ...

- exit 0: done. Exit 81 (non-finite halt) or 2 (refused configuration): never relaunched, the same
  failure would repeat.
- any other exit (a crash, a node failure, 143 after a coordinated stop): relaunched after a backoff,
  as long as the newest COMPLETE checkpoint keeps advancing; after `max_no_progress` attempts in a row
  without a newer checkpoint it gives up with the child's exit code.
- The child is tracked by the PID it was started with (kill -0 semantics through Popen.poll), never by
  a process-name pattern (docs/pitfalls.md#16); it runs in its own process group, and SIGTERM/SIGINT to the
  supervisor are forwarded to that group and end the supervision.
- Every decision is a row in <run_dir>/supervisor.jsonl.

The run dir must be the same for every attempt (so the relaunch finds the checkpoints): it is taken
from `hydra.run.dir=` in the command, or from --run-dir, or created once here and appended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Optional, Sequence

from align.control.ckpt_index import checkpoint_root, newest
from align.control.exit_record import EXIT_DIR_ENV, recorded_exit

NEVER_RELAUNCH = {2: "configuration refused", 81: "non-finite halt"}


@dataclass
class Policy:
    max_no_progress: int = 3
    """Give up after this many attempts in a row that did not advance the newest complete checkpoint."""
    backoff_s: float = 10.0
    """Wait before the first relaunch; doubles with each attempt without progress."""
    backoff_max_s: float = 300.0
    poll_s: float = 0.5


def run_dir_of(command: list[str]) -> Optional[Path]:
    for arg in command:
        if arg.startswith("hydra.run.dir="):
            return Path(arg.split("=", 1)[1])
    return None


def with_run_dir(command: list[str], run_dir: Optional[Path]) -> tuple[list[str], Path]:
    """The command with one fixed run dir for every attempt (docs/pitfalls.md#10: ${now} differs per launch)."""
    given = run_dir_of(command)
    if given is not None:
        return command, given
    run_dir = run_dir or Path("outputs") / datetime.now().strftime("%Y-%m-%d_%H-%M-%S-%f")
    return [*command, f"hydra.run.dir={run_dir}"], run_dir


class Supervisor:
    def __init__(self, command: Sequence[str], run_dir: Optional[Path] = None, policy: Policy | None = None) -> None:
        self.command, self.run_dir = with_run_dir(list(command), run_dir)
        self.policy = policy or Policy()
        self.child: Optional[subprocess.Popen] = None
        self.stopping: Optional[str] = None

    # -------------------------------------------------------------------------------- records

    def record(self, event: str, **fields) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        row = {"time": time.time(), "event": event, **fields}
        with open(self.run_dir / "supervisor.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"align.tools.supervise: {event} " + " ".join(f"{k}={v}" for k, v in fields.items() if k != "command"),
              file=sys.stderr, flush=True)

    def newest_step(self) -> Optional[int]:
        found = newest(checkpoint_root(self.run_dir))
        return found[0] if found else None

    # ---------------------------------------------------------------------------------- child

    def alive(self) -> bool:
        """kill -0 on the PID we started (through Popen, which also reaps it: no zombie, no pattern)."""
        return self.child is not None and self.child.poll() is None

    def _forward(self, signum: int, frame) -> None:
        self.stopping = signal.Signals(signum).name
        if self.alive():
            os.killpg(self.child.pid, signum)

    def launch(self, attempt: int) -> int:
        """Run one attempt; its exit code as a shell reports it (128+N for a signal), or the code
        the ranks recorded when the launcher (torchrun) collapsed theirs into 1."""
        started = time.time()
        # The attempt's ranks record their codes in a dir of its own too: a start refused into a run dir
        # that held a run leaves that dir as it was (align.parallel.launch.Attempt), its code only there.
        with tempfile.TemporaryDirectory(prefix="align-exit-") as exit_dir:
            self.child = subprocess.Popen(self.command, start_new_session=True,
                                          env={**os.environ, EXIT_DIR_ENV: exit_dir})
            self.record("launch", attempt=attempt, pid=self.child.pid, command=self.command)
            while self.alive():
                time.sleep(self.policy.poll_s)
            rc = self.child.returncode
            rc = 128 - rc if rc < 0 else rc
            recorded = None
            if rc != 0:
                recorded = recorded_exit(Path(exit_dir))
                recorded = recorded_exit(self.run_dir, started) if recorded is None else recorded
        return recorded if recorded is not None and rc not in NEVER_RELAUNCH else rc

    # ----------------------------------------------------------------------------------- loop

    def run(self) -> int:
        main = threading.current_thread() is threading.main_thread()  # handlers can only be set there
        previous = {s: signal.signal(s, self._forward) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
        try:
            return self._loop()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def stop(self, reason: str = "stop()") -> None:
        """End the supervision from another thread: the child is terminated and nothing relaunched."""
        self.stopping = reason
        if self.alive():
            os.killpg(self.child.pid, signal.SIGTERM)

    def _loop(self) -> int:
        p = self.policy
        attempt, no_progress, best = 0, 0, self.newest_step()
        while True:
            attempt += 1
            code = self.launch(attempt)
            step = self.newest_step()
            progressed = step is not None and (best is None or step > best)
            best = step if progressed else best
            self.record("exit", attempt=attempt, pid=self.child.pid, code=code, newest_checkpoint=step,
                        progressed=progressed)
            if code == 0:
                self.record("done", attempts=attempt)
                return 0
            if self.stopping:
                self.record("stopped", signal=self.stopping, code=code)
                return code
            if code in NEVER_RELAUNCH:
                self.record("give_up", reason=NEVER_RELAUNCH[code], code=code)
                return code
            no_progress = 0 if progressed else no_progress + 1
            if no_progress >= p.max_no_progress:
                self.record("give_up", reason=f"{no_progress} attempts without a newer complete checkpoint", code=code)
                return code if code > 0 else 1
            wait = min(p.backoff_s * 2 ** max(no_progress - 1, 0), p.backoff_max_s)
            self.record("backoff", seconds=wait, next_attempt=attempt + 1)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and not self.stopping:
                time.sleep(min(p.poll_s, max(deadline - time.monotonic(), 0)))
            if self.stopping:
                self.record("stopped", signal=self.stopping, code=code)
                return code
