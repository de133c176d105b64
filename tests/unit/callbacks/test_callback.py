"""The hooks (align/callbacks/callback.py) reach every callback in the list's order, and the run's list
keeps the order align/callbacks/__init__.py gives its reasons for."""

from __future__ import annotations

from align.callbacks import Callback, Callbacks


class Recording(Callback):
    def __init__(self, name: str, calls: list) -> None:
        super().__init__(trainer=None)
        self.name, self.calls = name, calls

    def pre_train(self):
        self.calls.append((self.name, "pre_train"))

    def pre_log_metrics(self, metrics, stopping):
        metrics[self.name] = stopping  # what an earlier callback adds, a later one sees
        self.calls.append((self.name, "pre_log_metrics", dict(metrics)))

    def log_metrics(self, metrics):
        self.calls.append((self.name, "log_metrics", dict(metrics)))

    def post_step(self, step, stopping):
        self.calls.append((self.name, "post_step", step, stopping))

    def post_train(self, code):
        self.calls.append((self.name, "post_train", code))

    def close(self):
        self.calls.append((self.name, "close"))


def test_each_hook_runs_on_every_callback_in_list_order():
    calls: list = []
    cbs = Callbacks([Recording("a", calls), Callback(None), Recording("b", calls)])  # a plain Callback does nothing
    metrics = {"step": 3}
    cbs.pre_train()
    cbs.pre_log_metrics(metrics, True)
    cbs.log_metrics(metrics)
    cbs.post_step(3, True)
    cbs.post_train(143)
    cbs.close()
    assert calls == [
        ("a", "pre_train"), ("b", "pre_train"),
        ("a", "pre_log_metrics", {"step": 3, "a": True}), ("b", "pre_log_metrics", {"step": 3, "a": True, "b": True}),
        ("a", "log_metrics", metrics), ("b", "log_metrics", metrics),
        ("a", "post_step", 3, True), ("b", "post_step", 3, True),
        ("a", "post_train", 143), ("b", "post_train", 143),
        ("a", "close"), ("b", "close"),
    ]


def test_the_run_list_keeps_its_documented_order(tmp_path):
    from tests.conftest import build_trainer

    t = build_trainer(tmp_path, "trainer.max_steps=1", "trainer.export=false")
    assert [type(c).__name__ for c in t.callbacks] == [
        "CompileArtifacts", "EvalCadence", "StepRows", "LossPlot", "ConsoleProgress", "SkipLimit", "Checkpoints",
        "TrackerFinish"]
    assert t.history is not None and t.logger is not None  # opened once the start was accepted
    t.logger.finish(0)
    t.history.close()
