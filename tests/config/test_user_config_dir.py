"""A user's experiment files outside the package: `--config-dir <dir>` and `hydra.searchpath=[file://<dir>]`
reach align's own compose (the pass before Hydra) as they reach Hydra's."""

from __future__ import annotations

from pathlib import Path

import pytest

from align.run import cli
from tests.conftest import run_cli

EXPERIMENT = """# @package _global_
trainer:
  max_steps: 1
  seed: 7
  export: false
optimizer:
  lr: 0.0002
logger:
  kind: none
data:
  max_records: 16
"""


def _user_dir(root: Path) -> Path:
    (root / "experiment").mkdir(parents=True)
    (root / "experiment" / "mine.yaml").write_text(EXPERIMENT)
    return root


@pytest.mark.parametrize("how", ["--config-dir", "-cd", "searchpath"])
def test_an_experiment_outside_the_package_composes(tmp_path, how):
    d = _user_dir(tmp_path / "my conf")
    argv = [f"hydra.searchpath=[\"file://{d}\"]"] if how == "searchpath" else [how, str(d)]
    [typed] = cli.validate_command_line([*argv, "experiment=mine"])
    assert (typed.trainer.max_steps, typed.trainer.seed, typed.optimizer.lr) == (1, 7, 0.0002)
    assert typed.logger.kind.value == "none"


def test_config_dir_comes_before_the_searchpath_entries(tmp_path):
    first, second = _user_dir(tmp_path / "a"), _user_dir(tmp_path / "b")
    (second / "experiment" / "mine.yaml").write_text(EXPERIMENT.replace("seed: 7", "seed: 8"))
    [typed] = cli.validate_command_line(["--config-dir", str(first), f"hydra.searchpath=[file://{second}]",
                                         "experiment=mine"])
    assert typed.trainer.seed == 7  # Hydra's @hydra.main puts --config-dir ahead of hydra.searchpath


def test_a_missing_config_dir_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.validate_command_line(["--config-dir", str(tmp_path / "nowhere"), "experiment=mine"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("align: error: --config-dir: no such directory") and "\n" not in err


def test_train_runs_an_experiment_from_config_dir(tmp_path):
    d = _user_dir(tmp_path / "conf")
    run_dir = tmp_path / "run"
    p = run_cli("align.train", "--config-dir", str(d), "experiment=mine", f"hydra.run.dir={run_dir}",
                "allow_dirty=true")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "experiment=mine" in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert "seed: 7" in (run_dir / ".hydra" / "config.yaml").read_text()


def test_a_misspelt_option_lists_the_users_options_too(tmp_path, capsys):
    d = _user_dir(tmp_path / "conf")
    with pytest.raises(SystemExit):
        cli.validate_command_line(["--config-dir", str(d), "experiment=mnie"])
    err = capsys.readouterr().err.strip()
    assert err.startswith("align: error: experiment=mnie: no such option; accepted: ") and "mine" in err, err
    assert "smoke" in err and "\n" not in err
