"""The in-training eval (`eval=gsm8k trainer.eval_every=N`, align/evaluation/schedule.py) on one CPU
process: its rows come at the cadence and at the last step, training is bit-identical with and without
it (dropout on, so training draws from the global RNG after every eval), its time is not step time,
its cost is in the summary, and a resume keeps the cadence with one row per step."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import build_trainer

STEPS, EVERY = 5, 2
BASE = ["trainer.device=cpu", "trainer.export=false", "trainer.log_every=1000", "data.max_seq_len=96",
        "data.truncation=truncate", "data.max_records=64", "sampler=shuffle", "sampler.micro_batch_size=2",
        "optimizer.warmup_ratio=0",
        "+model.overrides.attention_dropout=0.2", f"trainer.max_steps={STEPS}"]
EVAL = ["eval=gsm8k", f"trainer.eval_every={EVERY}", "eval.limit=3", "eval.max_new_tokens=6"]


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines() if line.strip()]


def fit(tmp: Path, name: str, *overrides: str, patch=None):
    t = build_trainer(tmp / name, *BASE, *overrides)
    if patch is not None:
        patch(t)
    code = t.fit()
    return t, code, rows(t.run_dir)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("evals")
    plain = fit(tmp, "plain")
    with_eval = fit(tmp, "eval", *EVAL)
    return {"plain": plain, "eval": with_eval, "tmp": tmp}


def test_eval_rows_come_at_the_cadence_and_at_the_last_step(runs):
    t, code, hist = runs["eval"]
    assert code == 0
    evaluated = [r["step"] for r in hist if "eval/pass@1" in r]
    assert evaluated == [2, 4, 5]
    row = next(r for r in hist if r["step"] == 2)
    assert row["eval/samples"] == 3 and row["eval/seconds"] > 0 and row["eval/samples_per_s"] > 0
    assert 0 <= row["eval/mean_new_tokens"] <= 6
    assert t.model.training  # back in train mode after every eval
    assert not any(k.startswith("eval/") for k in runs["plain"][2][0])


def test_training_losses_are_bit_identical_with_and_without_the_eval(runs):
    plain, evald = runs["plain"][2], runs["eval"][2]
    assert [r["loss"] for r in plain] == [r["loss"] for r in evald]
    assert [r["grad_norm"] for r in plain] == [r["grad_norm"] for r in evald]


def test_dropout_makes_training_draw_from_the_global_rng(runs):
    """The control that gives the bit-identity test its teeth: with a shifted global RNG the losses differ."""
    def shift(t):
        torch.rand(1)

    _, _, shifted = fit(runs["tmp"], "shifted", patch=shift)
    assert [r["loss"] for r in shifted] != [r["loss"] for r in runs["plain"][2]]


def test_an_eval_part_that_draws_from_the_global_rng_leaves_training_as_it_was(runs, monkeypatch):
    from align.evaluation import scoring

    score = scoring.AnswerScorer.score

    def drawing(self, item, text):
        torch.rand(7)  # a careless scorer or backend: the eval's fork_rng keeps it from training's stream
        return score(self, item, text)

    monkeypatch.setattr(scoring.AnswerScorer, "score", drawing)
    _, _, hist = fit(runs["tmp"], "drawing", *EVAL)
    assert [r["loss"] for r in hist] == [r["loss"] for r in runs["plain"][2]]


def test_eval_time_is_neither_step_time_nor_throughput_but_is_in_the_summary(runs, monkeypatch):
    from align.evaluation import schedule

    generate = schedule.generate_shard

    def slow(*a, **k):
        time.sleep(0.6)
        return generate(*a, **k)

    monkeypatch.setattr(schedule, "generate_shard", slow)
    t, code, hist = fit(runs["tmp"], "slow", *EVAL)
    assert code == 0
    after = {r["step"]: r["step_time_s"] for r in hist if r["step"] in (3, 5)}  # steps 3 and 5 follow an eval
    assert all(dt < 0.6 for dt in after.values()), after
    s = t.summary()["eval"]
    assert s["count"] == 3 and s["seconds"] >= 1.8
    assert 0 < s["eval_share"] < 1
    assert s["resolved"]["data"]["records"] == 3 and s["resolved"]["engine"]["lockstep"] is False
    assert s["resolved"]["data"]["sha256"]


def test_a_resume_keeps_the_cadence_with_one_row_per_step(runs):
    tmp = runs["tmp"]
    # No dropout here: a checkpoint does not hold the global RNG's state, so dropout would differ after it.
    plain = ("model.overrides.attention_dropout=0.0", *EVAL, "trainer.save_every=3", "trainer.keep_last=0")
    t, code, first = fit(tmp, "resume", *plain)
    ckpt = t.run_dir / "checkpoints" / "step_00000003"
    assert code == 0 and ckpt.is_dir()
    again = build_trainer(tmp / "resume", *BASE, *plain, f"trainer.resume_from={ckpt}")
    assert again.state.step == 3
    assert again.fit() == 0
    hist = rows(again.run_dir)
    assert [r["step"] for r in hist] == [1, 2, 3, 4, 5]
    assert [r["step"] for r in hist if "eval/pass@1" in r] == [2, 4, 5]
    for a, b in zip(first, hist):
        assert a["loss"] == b["loss"]
        assert {k: v for k, v in a.items() if k.startswith("eval/") and "_s" not in k and k != "eval/seconds"} == \
            {k: v for k, v in b.items() if k.startswith("eval/") and "_s" not in k and k != "eval/seconds"}


def _compiled_graphs(tmp: Path, name: str, monkeypatch, *overrides: str):
    import functools

    import torch._dynamo
    from torch._dynamo.utils import counters

    import align.parallel.compile as comp
    import align.trainer

    monkeypatch.setattr(align.trainer, "compile_blocks", functools.partial(comp.compile_blocks, backend="eager"))
    torch._dynamo.reset()
    counters.clear()
    t, code, hist = fit(tmp, name, "trainer.compile=true", "trainer.max_steps=3", *overrides)
    assert code == 0
    return t, int(counters["stats"]["unique_graphs"]), hist


def test_an_eval_leaves_compiled_training_blocks_alone(tmp_path, monkeypatch):
    """Generating through the compiled training blocks made dynamo recompile them (new shapes, no
    grad, a KV cache) until its limit sent training to eager: the eval generates with its own copy."""
    _, plain, _ = _compiled_graphs(tmp_path, "plain", monkeypatch)
    t, with_eval, hist = _compiled_graphs(tmp_path, "eval", monkeypatch, *EVAL[:-3], "trainer.eval_every=1",
                                          "eval.limit=2", "eval.max_new_tokens=4")
    assert [r["step"] for r in hist if "eval/pass@1" in r] == [1, 2, 3]
    assert with_eval == plain
    copy = t.evals.copy
    assert copy is not None and copy.model is not t.model and copy.describe()["weights"] == "copy (sync_from)"
    assert t.evals.described["engine"]["weights"] == "copy (sync_from)"


def test_eval_rows_and_the_eval_cost_reach_wandb(tmp_path):
    """The same eval/* keys land in the W&B run's history at the eval steps, and the cost in its summary."""
    from tests.wandb_log import read_run

    t, code, hist = fit(tmp_path, "wb", *EVAL, "trainer.max_steps=3", "logger=wandb", "logger.mode=offline")
    assert code == 0
    (wb,) = [read_run(d) for d in (t.run_dir / "wandb").glob("offline-run-*")]
    at = {r["train/step"]: r for r in wb["history"] if "eval/pass@1" in r}  # W&B's own _step counts from 0
    assert sorted(at) == [2, 3]
    assert at[2]["eval/pass@1"] == next(r for r in hist if r["step"] == 2)["eval/pass@1"]
    assert wb["summary"]["eval/count"] == 2 and 0 < wb["summary"]["eval/eval_share"] < 1
