"""The launchers: torchrun.sh on 2 CPU processes (one run dir, only rank 0 writes .hydra/ and the
history, per-rank files under rank<r>/, exit codes the ranks recorded), and the Slurm launcher config
up to the sbatch script submitit generates (a fake `sbatch` captures it; nothing is submitted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

TINY = ["logger=none", "trainer.device=cpu", "trainer.export=false", "data.max_records=48", "data.max_seq_len=64",
        "data.truncation=truncate", "sampler=shuffle", "sampler.micro_batch_size=2", "allow_dirty=true"]


def _env(**extra) -> dict:
    bindir = str(Path(sys.executable).parent)
    return {**os.environ, "PYTHON": sys.executable, "PATH": bindir + os.pathsep + os.environ["PATH"],
            "PYTHONUNBUFFERED": "1", **extra}


def test_torchrun_launcher_gives_every_rank_one_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [str(REPO / "launchers" / "torchrun.sh"), "parallel=fsdp", "trainer.max_steps=3",
           f"hydra.run.dir={run_dir}", *TINY]
    p = subprocess.run(cmd, env=_env(NPROC="2"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert not (run_dir / "rank1" / ".hydra").exists() and not list(tmp_path.glob("*/rank1/.hydra"))
    rows = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]  # rank 0 alone writes it, values reduced over ranks
    assert (run_dir / "rank1" / "train.log").is_file()
    assert [json.loads((run_dir / f"rank{r}" / "exit.json").read_text())["code"] for r in (0, 1)] == [0, 0]

    # the same launch again: every rank refuses the finished run dir before Hydra runs, and the launcher
    # reports their 2 (recorded in its own exit dir), not torchrun's 1; not a file of the run changes
    before = {f: f.read_bytes() for f in run_dir.rglob("*") if f.is_file()}
    p = subprocess.run(cmd, env=_env(NPROC="2"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-3000:]
    refusals = [ln for ln in p.stderr.splitlines() if ln.startswith("align: error:")]
    # each rank refuses alone; torchrun stops the other worker once the first exits, so under load the
    # second rank's line may never be printed (its refusal, or its stop, leaves the run dir as it was)
    assert 1 <= len(refusals) <= 2 and all(f"{run_dir} holds a finished run" in ln for ln in refusals), refusals
    assert {f: f.read_bytes() for f in run_dir.rglob("*") if f.is_file()} == before


FAKE_TORCHRUN = """#!/bin/sh
# plays `python -m torch.distributed.run ...` whose ranks recorded {code} and which itself exits 1;
# anything else goes to the real python
if [ "$1" = "-m" ] && [ "$2" = "torch.distributed.run" ]; then
  for a in "$@"; do case "$a" in hydra.run.dir=*) d="${{a#hydra.run.dir=}}";; esac; done
  for r in 0 1; do
    mkdir -p "$d/rank$r"
    printf '{{"rank": %s, "code": {code}, "time": %s}}' $r "$(date +%s)" > "$d/rank$r/exit.json"
  done
  exit 1
fi
exec {python} "$@"
"""


@pytest.mark.parametrize("code", [81, 143, 2])
def test_torchrun_launcher_reports_the_code_the_ranks_recorded_not_torchruns_1(tmp_path, code):
    fake = tmp_path / "python"
    fake.write_text(FAKE_TORCHRUN.format(code=code, python=sys.executable))
    fake.chmod(0o755)
    p = subprocess.run([str(REPO / "launchers" / "torchrun.sh"), f"hydra.run.dir={tmp_path / 'run'}"],
                       env=_env(NPROC="2", PYTHON=str(fake)), capture_output=True, text=True, timeout=60)
    assert p.returncode == code, p.stderr


def test_slurm_launcher_config_generates_the_submission(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    captured = tmp_path / "captured.sh"
    (fake / "srun").write_text("#!/bin/sh\nexit 0\n")
    (fake / "sbatch").write_text(f"#!/bin/sh\ncp \"$1\" {captured}\n"
                                 "echo 'sbatch: fake, nothing submitted' >&2\nexit 1\n")
    for f in ("srun", "sbatch"):
        (fake / f).chmod(0o755)
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "align.train", "-m", "hydra/launcher=slurm", f"hydra.sweep.dir={sweep}",
           "hydra.launcher.partition=gpu", "hydra.launcher.nodes=2", "parallel=fsdp", "model=olmoe", *TINY]
    env = _env()
    env["PATH"] = str(fake) + os.pathsep + env["PATH"]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "nothing submitted" in p.stderr + p.stdout
    script = captured.read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu", "#SBATCH --signal=USR2@300", "#SBATCH --cpus-per-task=12"):
        assert line in script, f"{line!r} not in the generated sbatch script:\n{script}"
    assert "srun" in script and "submitit.core._submit" in script and str(sweep) in script
    assert list((sweep / ".submitit").rglob("*.pkl")), "the pickled job submitit would run"
