"""What the bench harness tests share: an empty $OUT per test and bench/run.py's --dry-run read back."""

from __future__ import annotations

import pytest


@pytest.fixture
def out(tmp_path, monkeypatch):
    d = tmp_path / "out"
    monkeypatch.setenv("OUT", str(d))
    return d


def dry_run(capsys, *argv: str) -> dict[str, str]:
    """arm -> its command line, as `bench/run.py --dry-run` prints them."""
    from bench import run as harness

    assert harness.main(["--dry-run", *argv]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    return dict(line.split(": ", 1) for line in lines)
