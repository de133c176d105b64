"""Checkpoints (align/callbacks/checkpointing.py): written on the cadence and on a stop, each after
its step's history row; a checkpoint that does not load is named in one line."""

from __future__ import annotations

import json
import traceback

from torch.distributed.checkpoint.api import CheckpointException

import align.callbacks.checkpointing as checkpointing
from tests.conftest import build_trainer


def test_the_cadence_and_a_stop_write_after_the_steps_row(tmp_path, monkeypatch):
    t = build_trainer(tmp_path, "trainer.max_steps=6", "trainer.save_every=2", "trainer.keep_last=0",
                      "trainer.export=false")
    rows_at_save = []
    save = checkpointing.save_checkpoint

    def counting(root, step, *args, **kwargs):
        rows_at_save.append((step, len((t.run_dir / "history.jsonl").read_text().splitlines())))
        return save(root, step, *args, **kwargs)

    monkeypatch.setattr(checkpointing, "save_checkpoint", counting)
    inner = t.train_step

    def train_step(batches):
        if t.state.step == 2:
            t.stop.request("test: stop during step 3")
        return inner(batches)

    t.train_step = train_step
    assert t.fit() == 143
    assert rows_at_save == [(2, 2), (3, 3)]  # each checkpoint follows its step's row
    reasons = {s: json.loads((t.run_dir / "checkpoints" / f"step_{s:08d}" / "meta.json").read_text())["reason"]
               for s in (2, 3)}
    assert reasons == {2: "cadence", 3: "stop"}


def test_a_checkpoint_that_does_not_load_is_one_line_naming_the_failed_ranks():
    trace = traceback.StackSummary.from_list([])
    e = CheckpointException("load failed", {1: (ValueError("shard 3 is short\nmore detail"), trace)})
    assert checkpointing.load_failure(e) == "ValueError on rank(s) [1]: shard 3 is short"
    assert checkpointing.load_failure(OSError("")) == "OSError: no message"
    assert len(checkpointing.load_failure(RuntimeError("x" * 1000))) == 300
