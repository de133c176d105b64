"""`align <command>`: the console script pyproject.toml installs dispatches to each entry's own `main` with
the same arguments, lists its commands on --help, refuses an unknown one in one line (exit 2), and
imports nothing heavy before it knows the command. The argparse tools take Hydra-style `name=value`
beside their positionals and `--name value`."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
import tomllib

import pytest

import align.tools
from align.__main__ import COMMANDS, main
from align.tools import keyed_argv
from tests.conftest import REPO
from tests.unit.tools.test_annotate import run_dir  # noqa: F401  (the fixture)
from tests.unit.tools.test_report import _job, _row


def test_the_console_script_is_this_main():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attr = scripts["align"].partition(":")
    assert getattr(importlib.import_module(module), attr) is main


def test_every_entry_point_is_a_command_with_a_main():
    tools = {m.name for m in pkgutil.iter_modules(align.tools.__path__)}
    assert {m for m, _ in COMMANDS.values()} >= {"align.train", "align.eval", *(f"align.tools.{t}" for t in tools)}
    assert all(callable(importlib.import_module(m).main) for m, _ in COMMANDS.values())


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"\n  {name} " in out for name in COMMANDS)


@pytest.mark.parametrize("argv,code", [(["trian"], 2), ([], 2)], ids=["unknown", "none"])
def test_an_unknown_or_missing_command_is_refused_with_the_list(argv, code, capsys):
    assert main(argv) == code
    err = capsys.readouterr().err
    if argv:
        assert err.count("\n") == 1 and err.startswith("align: error: unknown command 'trian'") and "train" in err
    else:
        assert all(name in err for name in COMMANDS)


def test_the_script_imports_neither_torch_nor_hydra_before_the_command_is_known():
    probe = ("import sys\nfrom align.__main__ import main\ncode = main(sys.argv[1:])\n"
             "print(code, sorted(m for m in ('torch', 'transformers', 'hydra', 'omegaconf') if m in sys.modules))")
    for args, want in ((["--help"], "0 []"), (["nope"], "2 []")):
        p = subprocess.run([sys.executable, "-c", probe, *args], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert p.stdout.splitlines()[-1] == want, p.stdout + p.stderr


@pytest.mark.parametrize("style", ["positional", "keyed"])
def test_report_takes_its_dir_either_way(tmp_path, monkeypatch, style):
    _job(tmp_path, 0, ["optimizer.lr=1e-4"], [_row(1, 5.0, 100, 50, 1.0, 0, 3), _row(2, 4.0, 100, 60, 1.0, 0, 2)])
    out = tmp_path / "elsewhere"
    monkeypatch.setattr(sys, "argv", ["pytest"])
    args = [str(tmp_path), "--out", str(out)] if style == "positional" else [f"dir={tmp_path}", f"out={out}"]
    assert main(["report", *args]) == 0
    assert [r["job"] for r in json.loads((out / "report.json").read_text())] == ["0"]
    assert sys.argv == ["align report", *args]  # what the tool read, as `python -m` would have set it


def test_annotate_takes_keyed_arguments(run_dir, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setattr(sys, "argv", ["pytest"])
    assert main(["annotate", f"run_dir={run_dir}", "text=read from another venv", "affects=versions"]) == 0
    note = (run_dir / "PROVENANCE-NOTE.md").read_text()
    assert "read from another venv" in note
    assert "`versions.torch`" in note.split("### Affected by this correction")[1].split("### Remains accurate")[0]


def test_train_dispatches_with_hydra_overrides(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["pytest"])
    assert main(["train", "--cfg", "job", "trainer.max_steps=3", "model=olmoe"]) == 0
    out = capsys.readouterr().out
    assert "max_steps: 3" in out and "family: olmoe" in out


REPORT = (("dir",), ("out",))
ANNOTATE = (("run_dir", "text"), ("affects",))
SUPERVISE = ((), ("max_no_progress", "backoff"))


@pytest.mark.parametrize("names,argv,want", [
    (REPORT, ["d"], ["d"]),
    (REPORT, ["dir=d"], ["d"]),
    (REPORT, ["dir=d", "out=o"], ["d", "--out", "o"]),
    (REPORT, ["--out", "o", "d"], ["d", "--out", "o"]),
    (ANNOTATE, ["r", "text=t"], ["r", "t"]),
    (ANNOTATE, ["text=t", "run_dir=r", "affects=a,b"], ["r", "t", "--affects", "a,b"]),
    (ANNOTATE, ["run_dir=r", "lr=3e-4 was wrong"], ["r", "lr=3e-4 was wrong"]),  # not a name of the tool: text
    (SUPERVISE, ["max_no_progress=3", "--backoff", "2"], ["--max-no-progress", "3", "--backoff", "2"]),
])
def test_keyed_arguments_become_argparse_ones(names, argv, want):
    assert keyed_argv(argv, *names) == want


def test_supervise_takes_keyed_options_before_its_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["pytest"])
    assert main(["supervise", "max_no_progress=1", "backoff=0", f"run_dir={tmp_path}", "--",
                 sys.executable, "-c", "pass"]) == 0
    assert "done attempts=1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["supervise", "max_no_progress=many", "--", sys.executable, "-c", "pass"])
    assert e.value.code == 2 and "--max-no-progress: invalid int value: 'many'" in capsys.readouterr().err
