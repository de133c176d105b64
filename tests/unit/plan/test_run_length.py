"""`trainer.epochs` instead of `trainer.max_steps`: exactly one decides, the steps come from the sampler's
plan of the data, and the manifest's `run_length` says which key decided and what it resolved to."""

from __future__ import annotations

import json

import pytest

from tests.conftest import build_trainer, recorded_run


def test_epochs_take_their_steps_from_the_samplers_plan(tmp_path):
    t = build_trainer(tmp_path, "trainer.epochs=2", "trainer.grad_accum=3")
    plan = [len(t.stream.sampler.rank_batches(e)) for e in range(2)]
    want = sum(plan) // 3
    assert want >= 1 and t.cfg.trainer.max_steps == want and t.cfg.trainer.epochs is None
    assert t.scheduler.lr_lambdas[0].keywords["num_training_steps"] == want  # the schedule ends with the run
    assert t.model_info["run_length"] == {"decided_by": "trainer.epochs", "max_steps": want, "epochs": 2,
                                          "micro_batches_per_epoch": plan, "grad_accum": 3,
                                          "micro_batches_left_out": sum(plan) - 3 * want}


def test_an_epoch_run_stops_there_and_its_manifest_says_so(tmp_path):
    t, run_dir = recorded_run(tmp_path, ["trainer.epochs=1", "trainer.grad_accum=2", "sampler=shuffle",
                                         "sampler.micro_batch_size=4", "data.max_records=16"])
    m = json.loads((run_dir / "provenance.json").read_text())
    per_epoch = len(t.stream.sampler.rank_batches(0))
    assert m["run_length"]["decided_by"] == "trainer.epochs" and m["run_length"]["max_steps"] == per_epoch // 2
    assert t.state.step == per_epoch // 2
    default = build_trainer(tmp_path / "d").model_info["run_length"]
    assert default == {"decided_by": "trainer.max_steps", "max_steps": 150, "epochs": None}


@pytest.mark.parametrize("overrides,line", [
    (["trainer.epochs=2", "trainer.max_steps=10"], "trainer.epochs: cannot be set with trainer.max_steps"),
    (["experiment=smoke", "trainer.epochs=1"], "give trainer.max_steps=null with trainer.epochs"),
    (["trainer.epochs=0"], "trainer.epochs: must be >= 1"),
    (["objective=grpo", "trainer.max_steps=null", "trainer.epochs=1"], "trainer.epochs: is for objective=sft and dpo"),
])
def test_both_set_or_a_bad_epochs_is_one_line(capsys, overrides, line):
    from align.run.cli import validate_command_line

    with pytest.raises(SystemExit) as e:
        validate_command_line(overrides)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err and line in err, err
