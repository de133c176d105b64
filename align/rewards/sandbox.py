"""A sandboxed Python tool, `objective.tools=[align.rewards.sandbox:python]`: the model's tool call
`{"name": "python", "arguments": {"code": "..."}}` runs its code and gets back what the code printed. It is
the one tool that executes what the model wrote, so it runs only where a config names it (no bundled
config does; the other tools parse the model's text as JSON arguments: align/rewards/tool_calls.py).

Each call runs the code in a process of its own, started through a launcher (`LAUNCHER`, a fresh
single-threaded interpreter, so nothing is done between fork and exec in the trainer's threaded process)
that, before it replaces itself by `python -I -c <code>`:

- takes the process out of the network, the machine's processes and the host's privileges: a user, a
  network and a pid namespace of its own (unshare(2), CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID). The
  network namespace has no interface but a loopback that is down, so not even the run's own local services
  (the distributed store, a tracker) can be reached; in the pid namespace the code sees no process of the
  machine to signal (not the trainer), and whatever it forks dies with it; in the user namespace it holds
  no capability on the host (a run as root loses the override of file permissions and mounts);
- bounds it with setrlimit: address space (`memory_mb`), CPU seconds, the size of any file it writes
  (`output_bytes`: its stdout and stderr are such files), open files and, unless the run is root, the
  processes of its user (`processes`; root's count is the whole machine's, so under root a fork bomb is
  bounded by the timeout's kill of the process group only).

The process gets an empty environment (none of the run's variables: no tokens, no tracker keys), stdin
closed and an empty working directory that is removed afterwards; at `timeout_s` of wall time its whole
process group is killed. The result is its stdout; a failure (an exception, a limit, the timeout) raises
`SandboxError` with what happened, which the model gets back as an `error:` tool message.

What it does not do: hide the file system. The code runs as the run's user and can read, and write,
what that user's own permissions allow (a root run's files are root's). Code from a model that must not
see or touch the machine's files belongs in a container: a tool of the user's own behind the same
`module:fn` interface.

Where the machine cannot give the process a network namespace (no user namespaces and not root, or not
Linux), loading the tool fails (`preflight`, before heavy work, exit 2): it never runs with the network.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

LAUNCHER = r"""
import ctypes, os, resource, sys
memory, cpu, output, nofile, nproc, root, code = sys.argv[1:8]
memory, cpu, output, nofile, nproc, root = (int(x) for x in (memory, cpu, output, nofile, nproc, root))
flags = 0x10000000 | 0x40000000 | 0x20000000  # CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID
try:
    failed = ctypes.CDLL(None, use_errno=True).unshare(flags) != 0
except (AttributeError, OSError):
    failed = True
if failed:
    sys.stderr.write("no user, network and pid namespaces: " + os.strerror(ctypes.get_errno()) + "\n")
    os._exit(97)


def status(s):
    return os.waitstatus_to_exitcode(s) if os.WIFEXITED(s) else 128 + os.WTERMSIG(s)


init = os.fork()
if init == 0:  # pid 1 of the new namespace; the kernel kills what is left in it when this exits
    code_pid = os.fork()
    if code_pid == 0:
        for limit, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_FSIZE, output),
                             (resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_CORE, 0)):
            resource.setrlimit(limit, (value, value))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the limit, SIGKILL a second later
        if not root:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        os.execv(sys.executable, [sys.executable, "-I", "-c", code])
    while True:  # orphans of the code are reparented here: reap them until the code itself ends
        pid, s = os.wait()
        if pid == code_pid:
            os._exit(status(s))
os._exit(status(os.waitpid(init, 0)[1]))
"""
"""Run as `python -I -S -c LAUNCHER <limits> <code>` in the call's working directory."""

NO_NAMESPACE = 97
"""The launcher's exit status when the network namespace was refused (the code did not run)."""


class SandboxError(RuntimeError):
    """The code failed or hit a limit; the message is what the model is told."""


@dataclass(frozen=True)
class PythonSandbox:
    """The tool: `python(code)` runs `code` as the module docstring says. Other limits: an instance of
    your own, e.g. `calc = PythonSandbox(timeout_s=2)` in your file, named as `/path/to/file.py:calc`."""

    timeout_s: float = 5.0
    """Wall-clock seconds before the process group is killed."""
    cpu_s: int = 5
    """CPU seconds (RLIMIT_CPU)."""
    memory_mb: int = 512
    """Address space in MiB (RLIMIT_AS)."""
    output_bytes: int = 65536
    """The most bytes it may write to any file, its stdout and stderr included (RLIMIT_FSIZE)."""
    open_files: int = 64
    """RLIMIT_NOFILE."""
    processes: int = 16
    """RLIMIT_NPROC of the run's user, unless it is root (module docstring)."""
    max_code_chars: int = 20000
    """Longest code accepted (a longer one is refused unrun)."""

    def __call__(self, code: str) -> str:
        if not isinstance(code, str):
            raise SandboxError(f"code must be a string, got {type(code).__name__}")
        if len(code) > self.max_code_chars:
            raise SandboxError(f"code longer than {self.max_code_chars} characters")
        if "\x00" in code:
            raise SandboxError("code holds a NUL character")
        return self._run(code)

    def _run(self, code: str) -> str:
        root = os.getuid() == 0
        limits = [self.memory_mb << 20, self.cpu_s, self.output_bytes, self.open_files, self.processes, int(root)]
        with tempfile.TemporaryDirectory(prefix="align-sandbox-") as tmp:
            work = Path(tmp)
            out, err = work / "stdout", work / "stderr"
            with open(out, "wb") as o, open(err, "wb") as e:
                p = subprocess.Popen([sys.executable, "-I", "-S", "-c", LAUNCHER, *map(str, limits), code], cwd=work,
                                     env={"PATH": os.defpath, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
                                     stdin=subprocess.DEVNULL, stdout=o, stderr=e, start_new_session=True)
                try:
                    rc = p.wait(timeout=self.timeout_s)
                except subprocess.TimeoutExpired:
                    rc = None
                finally:
                    _kill_group(p)
            stdout = out.read_bytes()[:self.output_bytes].decode("utf-8", "replace")
            stderr = err.read_bytes()[:self.output_bytes].decode("utf-8", "replace")
        if rc is None:
            raise SandboxError(f"timed out after {self.timeout_s:g} s")
        if rc == NO_NAMESPACE:
            raise SandboxError(f"not run: {_last_line(stderr)}")
        if rc > 128 and rc - 128 in signal.valid_signals():
            raise SandboxError(_signal_said(rc - 128, self))
        if rc != 0:
            raise SandboxError(_last_line(stderr) or f"exit status {rc}")
        return stdout.rstrip("\n")

    def preflight(self) -> str:
        """What loading the tool checks: the launcher can take a process out of the network here (a probe
        call); ValueError with why not. Returns what was checked."""
        if not sys.platform.startswith("linux"):
            raise ValueError(f"the sandbox needs Linux network namespaces; this is {sys.platform}")
        try:
            got = self("print(6 * 7)")
        except SandboxError as e:
            raise ValueError(f"the sandbox cannot run here, it would not be cut off from the network ({e})") from None
        if got != "42":
            raise ValueError(f"the sandbox's probe printed {got!r}, not 42")
        return (f"sandboxed python: no network, {self.timeout_s:g} s, {self.memory_mb} MiB, "
                f"{self.output_bytes} bytes of output")


def _kill_group(p: subprocess.Popen) -> None:
    """Kill the call's whole process group (what the code forked too), then reap the process."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    p.wait()


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _signal_said(sig: int, box: PythonSandbox) -> str:
    why = {signal.SIGXCPU: f"CPU time over {box.cpu_s} s", signal.SIGXFSZ: f"output over {box.output_bytes} bytes",
           signal.SIGKILL: "killed"}.get(sig)
    name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
    return f"killed by {name}" + (f" ({why})" if why else "")


python = PythonSandbox()
"""The tool `objective.tools=[align.rewards.sandbox:python]` names."""
