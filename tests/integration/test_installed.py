"""A non-editable install runs from any directory: the wheel carries conf/ (as align/conf/) and the
bundled data assets, and align.run.cli finds them there."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

# What the wheel is built from: everything pyproject.toml packages, nothing else of the checkout.
SOURCES = ("pyproject.toml", "README.md", "align", "conf")


def _setuptools_major() -> int:
    try:
        return int(importlib.metadata.version("setuptools").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return 0


def _install(tmp_path: Path) -> Path:
    src, site = tmp_path / "src", tmp_path / "site"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    # The environment's own setuptools when it meets pyproject's build requirement (no registry
    # needed); else pip's isolated build.
    flags = ["--no-build-isolation"] if _setuptools_major() >= 68 else []
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *flags, "--target", str(site),
                        str(src)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    # pyproject.toml's include-package-data: with it on, setuptools printed a page per conf/ and assets/ folder
    assert not re.search(r"\w+Warning\b", p.stderr), p.stderr[:3000]
    return site


def _env(site: Path) -> dict[str, str]:
    # The installed copy first, then the caller's path (the environment's own packages stay reachable).
    path = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": path}


def _run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(site), capture_output=True, text=True,
                          timeout=300)


def test_an_installed_align_composes_and_preflights_from_another_directory(tmp_path):
    site = _install(tmp_path)
    assert (site / "align" / "conf" / "train.yaml").is_file() and (site / "align" / "data" / "assets").is_dir()
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    where = _run(site, cwd, "-c", "import align, align.run.cli; print(align.__file__); print(align.run.cli.CONF_DIR)")
    assert where.returncode == 0, where.stderr[-2000:]
    module, conf = where.stdout.split()
    assert Path(module).is_relative_to(site) and Path(conf) == site / "align" / "conf"

    job = _run(site, cwd, "-m", "align.train", "--cfg", "job", "model=olmoe", "sampler=bucket")
    assert job.returncode == 0, job.stderr[-2000:]
    assert "family: olmoe" in job.stdout and "kind: bucket" in job.stdout

    # The console script pip wrote (pyproject.toml [project.scripts]), run as a user would.
    script = site / "bin" / "align"
    assert "preflight" in subprocess.run([str(script), "--help"], cwd=cwd, env=_env(site), capture_output=True,
                                         text=True, timeout=60).stdout
    pre = subprocess.run([str(script), "preflight", "allow_dirty=true"], cwd=cwd, env=_env(site), capture_output=True,
                         text=True, timeout=300)
    assert pre.returncode == 0, (pre.stdout + pre.stderr)[-3000:]
    assert f"data file: {site / 'align' / 'data' / 'assets' / 'gsm8k' / 'train.jsonl'}" in pre.stdout
    assert "preflight PASS" in pre.stdout
    assert not (cwd / "outputs").exists()  # --cfg job and preflight write no run dir
