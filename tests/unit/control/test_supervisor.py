"""The supervisor relaunches while checkpoints advance, gives up without progress, never relaunches
after 81 or 2, tracks its child by PID and records every decision. Children are tiny python scripts
that play a training run (they write complete-looking checkpoint dirs), so this takes seconds."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from align.control.supervisor import Policy, Supervisor

FAST = Policy(max_no_progress=2, backoff_s=0.05, backoff_max_s=0.1, poll_s=0.02)

# A child that plays one attempt of a training run; its behaviour per attempt comes from a plan.
CHILD = textwrap.dedent('''
    import json, os, sys, time
    from pathlib import Path
    run_dir = Path([a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("hydra.run.dir=")][0])
    plan = json.loads(Path(sys.argv[1]).read_text())
    n = len(list(run_dir.glob("attempt_*")))
    (run_dir / f"attempt_{n}").write_text(str(os.getpid()))
    step, code, sleep = plan[min(n, len(plan) - 1)]
    if step:
        d = run_dir / "checkpoints" / f"step_{step:08d}"
        for p in ("model", "optim"):
            (d / p).mkdir(parents=True, exist_ok=True)
            (d / p / ".metadata").write_text("x")
        (d / "rank0.json").write_text("{}")
        (d / "meta.json").write_text(json.dumps({"world_size": 1, "step": step}))
    time.sleep(sleep)
    sys.exit(code)
''')


def supervised(sup: Supervisor, timeout: float = 60) -> int:
    """Run the supervisor with a deadline: one that keeps relaunching fails the test as a HANG."""
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(sup.run()), daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        sup.stop("test deadline")
        t.join(10)
        pytest.fail(f"HANG: the supervisor was still relaunching after {timeout:.0f}s")
    return out[0]


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "supervisor.jsonl").read_text().splitlines()]


def _supervise(tmp_path: Path, plan: list, policy: Policy = FAST, prepare=None) -> tuple[int, list[dict], Path]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if prepare:
        prepare(run_dir)
    script, plan_file = tmp_path / "child.py", tmp_path / "plan.json"
    script.write_text(CHILD)
    plan_file.write_text(json.dumps(plan))
    code = supervised(Supervisor([sys.executable, str(script), str(plan_file), f"hydra.run.dir={run_dir}"],
                                 policy=policy))
    return code, _rows(run_dir), run_dir


def test_a_child_that_dies_once_after_progress_is_relaunched_and_finishes(tmp_path):
    code, rows, run_dir = _supervise(tmp_path, [(4, 1, 0), (8, 0, 0)])  # crash after checkpoint 4; then done
    assert code == 0
    launches = [r for r in rows if r["event"] == "launch"]
    exits = [r for r in rows if r["event"] == "exit"]
    assert len(launches) == 2 and [e["code"] for e in exits] == [1, 0]
    assert exits[0]["progressed"] is True and exits[0]["newest_checkpoint"] == 4
    # tracked by PID: the pid recorded is the child's own (it wrote its pid down)
    assert [lr["pid"] for lr in launches] == [int((run_dir / f"attempt_{i}").read_text()) for i in range(2)]
    assert rows[-1]["event"] == "done"


def test_a_child_that_never_progresses_is_given_up_after_n_attempts(tmp_path):
    code, rows, _ = _supervise(tmp_path, [(0, 1, 0)])
    assert code == 1
    assert [r["event"] for r in rows].count("launch") == FAST.max_no_progress
    assert rows[-1]["event"] == "give_up" and "without a newer complete checkpoint" in rows[-1]["reason"]


def test_an_unfinished_checkpoint_is_not_progress(tmp_path):
    # attempt 1 advances to step 2; attempts 2 and 3 die leaving only an unfinished .tmp dir
    code, rows, _ = _supervise(tmp_path, [(2, 1, 0), (0, 1, 0)],
                               prepare=lambda d: (d / "checkpoints" / "step_00000009.tmp" / "model").mkdir(
                                   parents=True))
    exits = [r for r in rows if r["event"] == "exit"]
    assert [e["progressed"] for e in exits] == [True, False, False]
    assert [e["newest_checkpoint"] for e in exits] == [2, 2, 2] and code == 1


@pytest.mark.parametrize("verdict", [81, 2])
def test_never_relaunched_after_a_halt_or_a_refused_config(tmp_path, verdict):
    code, rows, _ = _supervise(tmp_path, [(4, verdict, 0)])  # even though it progressed
    assert code == verdict
    assert [r["event"] for r in rows].count("launch") == 1 and rows[-1]["event"] == "give_up"


def test_a_halt_hidden_behind_torchrun_exit_1_is_still_not_relaunched(tmp_path):
    # torchrun collapses worker codes into 1; the ranks' own records say 81
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r})
        from align.control.exit_record import write_exit
        write_exit({str(run_dir)!r}, 0, 81); write_exit({str(run_dir)!r}, 1, 81)
        sys.exit(1)
    '''))
    code = supervised(Supervisor([sys.executable, str(script), f"hydra.run.dir={run_dir}"], policy=FAST))
    assert code == 81 and [r["event"] for r in _rows(run_dir)].count("launch") == 1


def test_sigterm_to_the_supervisor_is_forwarded_to_the_child_and_ends_supervision(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script, plan_file = tmp_path / "child.py", tmp_path / "plan.json"
    script.write_text(CHILD)
    plan_file.write_text(json.dumps([(0, 0, 60)]))  # would sleep a minute
    sup = Supervisor([sys.executable, str(script), str(plan_file), f"hydra.run.dir={run_dir}"], policy=FAST)
    threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
    t0 = time.monotonic()
    code = sup.run()
    assert time.monotonic() - t0 < 30
    assert code == 128 + signal.SIGTERM  # the child died of the forwarded SIGTERM
    rows = [json.loads(x) for x in (run_dir / "supervisor.jsonl").read_text().splitlines()]
    assert rows[-1]["event"] == "stopped" and [r["event"] for r in rows].count("launch") == 1


def test_the_run_dir_is_fixed_once_for_every_attempt(tmp_path):
    from align.control.supervisor import with_run_dir

    cmd, d = with_run_dir(["python", "-m", "align.train"], tmp_path / "r")
    assert cmd[-1] == f"hydra.run.dir={tmp_path / 'r'}" and d == tmp_path / "r"
    cmd2, d2 = with_run_dir(cmd, None)
    assert cmd2 == cmd and d2 == d


def test_a_refusal_recorded_outside_the_run_dir_is_not_relaunched(tmp_path):
    # a start refused into a run dir that held a run records its code in $ALIGN_EXIT_DIR only (the run
    # dir is left as it was), and torchrun collapses it into 1
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r})
        from align.control.exit_record import write_exit
        write_exit(None, 0, 2); write_exit(None, 1, 2)
        sys.exit(1)
    '''))
    code = supervised(Supervisor([sys.executable, str(script), f"hydra.run.dir={run_dir}"], policy=FAST))
    assert code == 2 and [r["event"] for r in _rows(run_dir)].count("launch") == 1
    assert not list(run_dir.glob("rank*"))
