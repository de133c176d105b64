"""Where a command's run dir goes, known before Hydra creates it, and when the command may not write
there (align/run/run_dir.py); what an attempt writes into a run dir that held a run before it is accepted
(align/parallel/launch.py)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from align.errors import ConfigError
from align.run.run_dir import check_run_dirs, finished_run, held_run, planned_run_dirs, unwritable

REPO = Path(__file__).resolve().parents[3]


def _plan(*overrides: str, multirun: bool = False, config_dir: Path = REPO / "conf"):
    from align.run.cli import job_override_lists

    jobs, multi = job_override_lists((["-m"] if multirun else []) + list(overrides))
    return planned_run_dirs(jobs, multi, config_dir, "train", "train")


def test_the_planned_dir_is_hydras_own_resolution_of_the_composed_config(tmp_path):
    assert _plan(f"hydra.run.dir={tmp_path}/${{name}}-${{hydra.job.name}}", "name=x") == [
        ("hydra.run.dir", tmp_path / "x-train")]
    (default,) = _plan()
    assert default[0] == "hydra.run.dir" and default[1].parent == Path("outputs") and not default[1].exists()
    assert _plan("optimizer.lr=1e-4,3e-4", f"hydra.sweep.dir={tmp_path}", multirun=True) == [
        ("hydra.sweep.dir", tmp_path / "0"), ("hydra.sweep.dir", tmp_path / "1")]
    subdir = "hydra.sweep.subdir=${hydra.job.override_dirname}"
    assert [d for _, d in _plan("optimizer.lr=1e-4,3e-4", f"hydra.sweep.dir={tmp_path}", subdir, multirun=True)] == [
        tmp_path / "optimizer.lr=0.0001", tmp_path / "optimizer.lr=0.0003"]


def test_a_run_dir_set_by_a_config_file_is_found_too(tmp_path):
    # an experiment (or a replay's primary config) may place the run: the command line does not say where
    import shutil

    from align.run.cli import CONF_DIR

    conf = shutil.copytree(CONF_DIR, tmp_path / "conf")
    (conf / "experiment" / "placed.yaml").write_text(
        f"# @package _global_\nhydra:\n  run:\n    dir: {tmp_path}/placed\n")
    assert _plan("experiment=placed", config_dir=conf) == [("hydra.run.dir", tmp_path / "placed")]


def _manifest(d: Path, status: str, code) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "provenance.json").write_text(json.dumps({"status": status, "run": {"exit_code": code}}))


def test_what_makes_a_run_dir_finished(tmp_path):
    _manifest(tmp_path / "done", "complete", 0)
    _manifest(tmp_path / "stopped", "complete", 143)
    _manifest(tmp_path / "killed", "built", None)
    (tmp_path / "exported" / "export").mkdir(parents=True)
    (tmp_path / "torchrun" / "rank0").mkdir(parents=True)
    (tmp_path / "torchrun" / "rank0" / "exit.json").write_text(json.dumps({"rank": 0, "code": 0}))
    (tmp_path / "evaluated").mkdir()
    (tmp_path / "evaluated" / "eval.json").write_text(json.dumps({"status": "complete", "run": {"exit_code": 0}}))
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "provenance.json").write_text('{"status": "comp')
    assert finished_run(tmp_path / "done") == "provenance.json: complete, exit 0"
    assert finished_run(tmp_path / "exported") == "export/"
    assert finished_run(tmp_path / "torchrun") == "rank0/exit.json: exit 0"
    assert finished_run(tmp_path / "evaluated") == "eval.json: complete, exit 0"
    for unfinished in ("stopped", "killed", "torn", "missing"):
        assert finished_run(tmp_path / unfinished) is None, unfinished
    assert held_run(tmp_path / "killed") == "provenance.json" and held_run(tmp_path / "missing") is None


def test_a_dir_that_cannot_be_created_or_written_says_why(tmp_path, monkeypatch):
    (tmp_path / "f").write_text("")
    assert unwritable(tmp_path / "f" / "run") == f"cannot create {tmp_path / 'f' / 'run'}: {tmp_path / 'f'} is a " \
                                                 "file, not a directory"
    assert unwritable(tmp_path / "f") == f"{tmp_path / 'f'} is a file, not a directory"
    assert unwritable(tmp_path / "new" / "run") is None and unwritable(tmp_path) is None
    statvfs = os.statvfs

    class ReadOnly:
        def __init__(self, st):
            self.f_flag = st.f_flag | os.ST_RDONLY

    monkeypatch.setattr(os, "statvfs", lambda p: ReadOnly(statvfs(p)))
    assert unwritable(tmp_path / "run") == f"cannot create {tmp_path / 'run'}: {tmp_path} is on a read-only filesystem"
    monkeypatch.setattr(os, "statvfs", statvfs)
    monkeypatch.setattr(os, "access", lambda p, mode: False)  # what a dir of another user reads as
    assert unwritable(tmp_path) == f"cannot write into {tmp_path}: {tmp_path} is not writable by this user"


def test_a_run_dir_path_holding_a_credential_is_refused_without_echoing_it(tmp_path):
    token = "hf_" + "a1B2c3D4e5" * 4
    with pytest.raises(ConfigError) as e:
        check_run_dirs([("hydra.run.dir", tmp_path / f"run-{token}")])
    assert token not in str(e.value) and "<redacted> holds a credential-shaped name" in str(e.value)
    check_run_dirs([("hydra.run.dir", tmp_path / ("ab12" * 10))])  # a 40-hex dir name (a commit) is a name


def test_an_interrupted_run_dir_is_the_trainings_to_resume_and_no_other_commands(tmp_path):
    _manifest(tmp_path / "run", "complete", 143)
    check_run_dirs([("hydra.run.dir", tmp_path / "run")])  # align.train: resumes there
    with pytest.raises(ConfigError, match="holds a run \\(provenance.json\\) that this command would replace"):
        check_run_dirs([("hydra.run.dir", tmp_path / "run")], resumes=False)


def test_a_held_run_dir_stages_the_attempts_config_and_log(tmp_path, monkeypatch):
    from align.run.hydra_files import STAGED_HYDRA, staging_overrides

    monkeypatch.delenv("RANK", raising=False)
    assert staging_overrides([], tmp_path / "new") == []
    _manifest(tmp_path / "run", "complete", 143)
    assert staging_overrides([], tmp_path / "run") == [
        f"hydra.output_subdir={STAGED_HYDRA}",
        f"hydra.job_logging.handlers.file.filename=${{hydra.runtime.output_dir}}/{STAGED_HYDRA}/${{hydra.job.name}}.log"]
    assert staging_overrides(["hydra/job_logging=stdout"], tmp_path / "run") == [f"hydra.output_subdir={STAGED_HYDRA}"]


@pytest.fixture
def attempt(monkeypatch):
    from align.parallel import launch

    monkeypatch.setattr(launch, "ATTEMPT", launch.Attempt(held=True))
    yield launch
    root = logging.getLogger()
    for h in [h for h in root.handlers if isinstance(h, (launch._PendingLog, logging.FileHandler))
              and "rank1" in launch._target(h)]:
        root.removeHandler(h)
        h.close()


def test_a_rank_keeps_its_log_in_memory_until_the_attempt_is_accepted(tmp_path, attempt):
    import torch

    from align.parallel.env import DistEnv

    env = DistEnv(rank=1, world=2, local_rank=1, device=torch.device("cpu"))
    attempt.log_rank_to_file(env, tmp_path)
    logging.getLogger("align").warning("before the resume decision")
    assert not (tmp_path / "rank1").exists()
    attempt.ATTEMPT.accepted = True
    attempt.adopt_rank_log()
    logging.getLogger("align").warning("after it")
    log = (tmp_path / "rank1" / "train.log").read_text()
    assert "before the resume decision" in log and log.index("before the resume") < log.index("after it")


def test_an_unaccepted_attempt_records_its_exit_outside_a_held_run_dir(tmp_path, attempt, monkeypatch):
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    monkeypatch.setenv("ALIGN_EXIT_DIR", str(tmp_path / "exits"))
    monkeypatch.setattr(HydraConfig, "get", staticmethod(
        lambda: OmegaConf.create({"runtime": {"output_dir": str(tmp_path / "run")}})))
    attempt.record_exit(2)
    assert not (tmp_path / "run").exists()
    assert json.loads((tmp_path / "exits" / "rank0" / "exit.json").read_text())["code"] == 2
    attempt.ATTEMPT.accepted = True
    attempt.record_exit(0)
    assert json.loads((tmp_path / "run" / "rank0" / "exit.json").read_text())["code"] == 0
