"""The in-training eval's cadence (align/callbacks/eval_cadence.py): on a due step its keys join the
row and its time is not the next step's; a stop skips it."""

from __future__ import annotations

from align.callbacks.eval_cadence import EvalCadence
from tests.conftest import build_trainer


def test_a_due_step_gets_the_eval_unless_the_run_stops(tmp_path):
    t = build_trainer(tmp_path, "trainer.max_steps=4", "trainer.export=false", "eval=gsm8k", "trainer.eval_every=2",
                      "eval.limit=1", "eval.max_new_tokens=2")
    cadence = EvalCadence(t)
    t.state.step = 2
    stopping = {"step": 2}
    cadence.pre_log_metrics(stopping, stopping=True)
    assert stopping == {"step": 2} and t.evals.count == 0  # a stop's time is the stop checkpoint's
    t.state.step, t.t_boundary = 3, 1.0
    off = {"step": 3}
    cadence.pre_log_metrics(off, stopping=False)
    assert off == {"step": 3} and t.t_boundary == 1.0  # not due: nothing ran
    t.state.step = 4
    due = {"step": 4}
    cadence.pre_log_metrics(due, stopping=False)
    assert due["eval/samples"] == 1 and t.evals.count == 1
    assert t.t_boundary is None  # the next step times from its own start, not across the eval
    t.history.close()
    t.logger.finish(0)
