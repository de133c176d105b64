"""Each step's row (align/callbacks/step_rows.py): the history row first, so a tracker that fails
leaves it written; at the end the tracker gets the run's summary and the history is closed."""

from __future__ import annotations

import json

import pytest

from align.callbacks.step_rows import StepRows, write_row
from tests.conftest import build_trainer


def test_the_history_row_is_written_before_the_tracker_and_closed_at_the_end(tmp_path):
    t = build_trainer(tmp_path, "trainer.max_steps=1", "trainer.export=false")
    rows = next(c for c in t.callbacks if isinstance(c, StepRows))

    def failing(*args, **kwargs):
        raise RuntimeError("tracker down")

    tracker_log, t.logger.log = t.logger.log, failing
    with pytest.raises(RuntimeError, match="tracker down"):
        write_row(t, {"step": 1, "loss": 2.5})
    assert [json.loads(x) for x in (t.run_dir / "history.jsonl").read_text().splitlines()] == [{"step": 1, "loss": 2.5}]
    t.logger.log = tracker_log
    summaries = []
    t.logger.summary = summaries.append
    rows.post_train(0)
    assert summaries and summaries[0]["steps"] == 0 and t.history._f.closed
    t.logger.finish(0)
