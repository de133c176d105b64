"""The sandboxed Python tool (align/rewards/sandbox.py): what the code prints comes back, its failures come back
as errors; it reaches no network (not the run's own port, which a plain process reaches), signals no process of
the machine, leaves nothing running, inherits no variable and stays within its time, CPU, memory and output
limits; a machine that cannot cut it off refuses it at load, in one line, exit 2; no bundled config names it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from align.errors import ConfigError
from align.rewards import sandbox
from align.rewards.sandbox import PythonSandbox, SandboxError, python
from align.rewards.tool_calls import ToolBox, call_text, load_tool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux namespaces")

SPEC = "align.rewards.sandbox:python"


def test_what_the_code_prints_comes_back_and_its_failures_as_errors():
    assert python("print(6 * 7)") == "42"
    with pytest.raises(SandboxError, match=r"^ZeroDivisionError: division by zero$"):
        python("1 / 0")
    with pytest.raises(SandboxError, match=r"^exit status 3$"):
        python("import sys; sys.exit(3)")
    with pytest.raises(SandboxError, match="NUL"):
        python("print(1)\x00")


def test_a_models_call_reaches_it_through_the_toolbox():
    box = ToolBox.load([SPEC])
    ok = box.respond("let me compute " + call_text("python", code="print(2 ** 10)"))
    assert (ok.content, ok.ok) == ("1024", True)
    bad = box.respond(call_text("python", code="import nothing_of_that_name"))
    assert not bad.ok and bad.content.startswith("error: python raised SandboxError: ModuleNotFoundError"), bad


def test_the_code_reaches_no_network_not_even_the_runs_own_port():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        port = server.getsockname()[1]
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')"
        plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        assert plain.stdout.strip() == "connected", plain.stderr  # the port is there for a plain process
        with pytest.raises(SandboxError, match="Network is unreachable"):
            python(code)


def test_the_code_signals_no_process_of_the_machine_and_nothing_it_starts_outlives_it(tmp_path):
    with pytest.raises(SandboxError, match="ProcessLookupError"):
        python(f"import os; os.kill({os.getpid()}, 0)")  # the trainer
    marker = tmp_path / "outlived"
    # A child that leaves the call's process group (so the group kill cannot reach it) and writes later.
    code = (f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(1.5)\n"
            f"    open({str(marker)!r}, 'w').write('x')\n    os._exit(0)\nprint('forked')")
    assert python(code) == "forked"
    time.sleep(2.5)
    assert not marker.exists()


def test_it_inherits_no_variable_and_runs_in_a_fresh_directory(monkeypatch):
    monkeypatch.setenv("ALIGN_SANDBOX_SECRET", "hunter2")
    got = python("import json, os; print(json.dumps([os.environ.get('ALIGN_SANDBOX_SECRET'), sorted(os.environ), "
                 "sorted(os.listdir('.')), os.getcwd()]))")
    secret, names, listing, cwd = json.loads(got)
    assert secret is None and "PATH" in names and not [n for n in names if n.startswith(("ALIGN", "WANDB", "HF_"))]
    assert listing == ["stderr", "stdout"] and Path(cwd).name.startswith("align-sandbox-")  # its own output only
    assert not Path(cwd).exists()  # removed after the call


@pytest.mark.parametrize("box,code,says", [
    (PythonSandbox(memory_mb=256), "b = bytearray(1 << 30)", "MemoryError"),
    (PythonSandbox(output_bytes=4096), "print('x' * 100000)", "File too large"),
    (PythonSandbox(timeout_s=10, cpu_s=1), "while True: pass", r"SIGXCPU \(CPU time over 1 s\)"),
    (PythonSandbox(timeout_s=1), "import time; time.sleep(30)", r"timed out after 1 s"),
], ids=["memory", "output", "cpu", "wall"])
def test_each_limit_holds(box, code, says):
    t0 = time.monotonic()
    with pytest.raises(SandboxError, match=says):
        box(code)
    assert time.monotonic() - t0 < 8


def test_a_machine_that_cannot_cut_it_off_refuses_it_at_load_in_one_line(monkeypatch, capsys):
    assert python.preflight().startswith("sandboxed python: no network")
    assert load_tool(SPEC, "objective.tools[0]").name == "python"
    # unshare(2) refused, as on a machine without user namespaces: flags it rejects (EINVAL) stand in.
    monkeypatch.setattr(sandbox, "LAUNCHER", sandbox.LAUNCHER.replace("flags = 0x10000000", "flags = -1 | 0x10000000"))
    with pytest.raises(SandboxError, match="not run: no user, network and pid namespaces"):
        python("print(1)")
    with pytest.raises(ConfigError, match=r"^objective.tools\[0\]: the sandbox cannot run here, it would not be cut "
                                          r"off from the network"):
        load_tool(SPEC, "objective.tools[0]")
    from align.run.cli import preflight_command_line

    with pytest.raises(SystemExit) as e:
        preflight_command_line(["allow_dirty=true", "objective=grpo", "objective.max_turns=2",
                                f"objective.tools=[{SPEC}]", "trainer.device=cpu"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "objective.tools[0]" in err, err


def test_no_bundled_config_names_it():
    conf = Path(__file__).resolve().parents[3] / "conf"
    assert not [p for p in conf.rglob("*.yaml") if "sandbox" in p.read_text()]
