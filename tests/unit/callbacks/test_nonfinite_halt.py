"""Too many non-finite steps in a row (align/callbacks/nonfinite_halt.py) halt the run after the step's
row and before its checkpoint: HALT.json, exit 81, the end-of-run records, no checkpoint of that step."""

from __future__ import annotations

import json

import pytest

from align.control.nonfinite import INJECT_ENV
from align.errors import NonFiniteHalt
from tests.conftest import build_trainer


def test_the_halting_step_has_its_row_and_no_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv(INJECT_ENV, "0:2-")  # every step from 2 has a NaN loss
    t = build_trainer(tmp_path, "trainer.max_steps=5", "trainer.max_consecutive_skipped_steps=1",
                      "trainer.save_every=1", "trainer.keep_last=0", "trainer.export=false")
    with pytest.raises(NonFiniteHalt, match="2 consecutive non-finite optimizer steps"):
        t.fit()
    rows = [json.loads(x) for x in (t.run_dir / "history.jsonl").read_text().splitlines()]
    assert [(r["step"], r["skipped"]) for r in rows] == [(1, False), (2, True), (3, True)]
    assert sorted(p.name for p in (t.run_dir / "checkpoints").iterdir()) == ["step_00000001", "step_00000002"]
    halt = json.loads((t.run_dir / "HALT.json").read_text())
    assert halt["step"] == 3 and halt["code"] == 81
    assert (t.run_dir / "plots" / "loss.png").is_file()  # the run's end records were written before the raise
