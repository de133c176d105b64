"""objective=reward_model built in-process on the tiny model and the bundled pairs: its loss is TRL's
RewardTrainer loss, a sequence's reward is read where transformers reads it (padded and packed), its step-0
gate holds the rewards and the loss that run, it learns an easy preference (held-out accuracy above chance),
its export loads with AutoModelForSequenceClassification and gives the same rewards, and the manifest records
what resolved."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from align.data.collate import collate
from align.data.encode import EncodedDataset
from align.errors import ConfigError
from align.models.scalar_head import reward_positions
from align.objectives.gate import GateError
from align.objectives.reward_loss import bradley_terry_losses
from tests.conftest import recorded_run
from tests.unit.objectives.conftest import TINY_DPO, first_batch

TINY_RM = ["objective=reward_model", *TINY_DPO[1:]]


def rm_trainer(root, *overrides: str):
    from align.config import to_typed
    from align.run.cli import compose
    from align.trainer import Trainer

    cfg = to_typed(compose([*TINY_RM, f"data.cache_dir={root / 'cache' / 'encode'}", *overrides]))
    return Trainer.build(cfg, root / "run")


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    return rm_trainer(tmp_path_factory.mktemp("rm"), "objective.center_rewards_coefficient=0.5")


# ------------------------------------------------------------------------------------------ the loss


def trl_loss(chosen, rejected, margin=None, coefficient=None) -> torch.Tensor:
    """TRL 1.16's RewardTrainer.compute_loss itself, on a model that returns these rewards (chosen rows, then
    rejected rows, as its collator stacks them)."""
    from trl.trainer.reward_trainer import RewardTrainer

    stub = SimpleNamespace(model=SimpleNamespace(training=True),
                           args=SimpleNamespace(center_rewards_coefficient=coefficient),
                           accelerator=SimpleNamespace(gather_for_metrics=lambda x: x, gather=lambda x: x),
                           _metrics={"train": defaultdict(list)}, _total_train_tokens=0, _tp_size=1)
    logits = torch.cat([chosen, rejected])[:, None]
    inputs = {"input_ids": torch.zeros(len(logits), 3, dtype=torch.long), "attention_mask": torch.ones(len(logits), 3)}
    if margin is not None:
        inputs["margin"] = margin
    return RewardTrainer.compute_loss(stub, lambda **kw: SimpleNamespace(logits=logits), inputs)


@pytest.mark.parametrize("margin", [False, True])
@pytest.mark.parametrize("coefficient", [None, 0.01, 0.7])
def test_the_loss_is_trls_reward_trainer_loss(margin, coefficient):
    g = torch.Generator().manual_seed(0)
    chosen, rejected = torch.randn(9, generator=g) * 3, torch.randn(9, generator=g) * 3
    m = torch.rand(9, generator=g) if margin else None
    ours = bradley_terry_losses(chosen, rejected, m, coefficient).mean()
    assert ours.item() == pytest.approx(trl_loss(chosen, rejected, m, coefficient).item(), rel=1e-6, abs=1e-6)


# ---------------------------------------------------------------------------- where the reward is read


def test_rewards_are_read_at_the_last_non_pad_token_as_transformers_reads_them(trainer):
    """A row whose own tokens end with the pad id: transformers' pooled logit is at the token before; ours
    too, padded (against the class's own pooling) and packed (against each sequence alone)."""
    pad = trainer.objective.pad_id
    seqs = [np.array([5, 9, 14, 7, 3], np.int32), np.array([5, 11, 8, pad], np.int32), np.array([6, 2], np.int32)]
    data = EncodedDataset(tokens=np.concatenate(seqs), loss_mask=np.ones(11, bool),
                          offsets=np.array([0, 5, 9, 11]), ids=["a", "b", "c"], roots=["a", "b", "c"])
    rows = np.arange(3)
    model = trainer.model.eval()
    with torch.no_grad():
        padded = collate(data, rows, pad)
        pooled = model(**padded.model_inputs()).logits[:, 0]
        scores = model.score(model.model(**padded.model_inputs()).last_hidden_state)[..., 0].reshape(-1)
        ours = scores[torch.as_tensor(reward_positions(data, rows, padded.input_ids.shape[1], False, pad))]
        packed = collate(data, rows, pad, packed=True)
        scores = model.score(model.model(**packed.model_inputs()).last_hidden_state)[..., 0].reshape(-1)
        ours_packed = scores[torch.as_tensor(reward_positions(data, rows, 0, True, pad))]
        alone = torch.cat([model(input_ids=torch.as_tensor(s[None], dtype=torch.long)).logits[:, 0] for s in seqs])
    model.train()
    assert reward_positions(data, rows, 5, False, pad).tolist() == [4, 5 + 2, 10 + 1]
    torch.testing.assert_close(ours, pooled, atol=1e-6, rtol=0)
    torch.testing.assert_close(ours_packed, alone, atol=1e-5, rtol=0)


# -------------------------------------------------------------------------------------------- the gate


def test_the_gate_passes_and_holds_the_rewards_and_the_loss(trainer):
    report = trainer.objective.gate(first_batch(trainer))
    assert report["batching_ok"] and report["loss_ok"], report
    assert report["loss_expected"] == pytest.approx(report["loss_run"], rel=1e-6)


def test_the_gate_fails_a_loss_that_is_not_the_configured_one(trainer, monkeypatch):
    obj = trainer.objective
    monkeypatch.setattr(obj, "loss_of", lambda c, r, m: bradley_terry_losses(c, r, m))  # the centring term dropped
    with pytest.raises(GateError, match="the loss that runs is not the loss configured"):
        obj.gate(first_batch(trainer))


def test_the_gate_fails_rewards_read_at_another_token(trainer, monkeypatch):
    import align.objectives.reward_model as rm

    monkeypatch.setattr(rm, "reward_positions", lambda *a: reward_positions(*a) - 1)
    with pytest.raises(GateError, match="batched rewards differ from each sequence's alone"):
        trainer.objective.gate(first_batch(trainer))


def test_the_gate_holds_packed_rows_too(tmp_path):
    t = rm_trainer(tmp_path, "sampler.packed=true")
    assert first_batch(t).packed
    assert t.objective.gate(first_batch(t))["batching_ok"]


# ------------------------------------------------------------------------------- learning and held-out


def easy_pairs(path, n: int = 48):
    """Pairs whose chosen completion ends in the word `good` and rejected one in `bad`, the rest random."""
    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        for _ in range(n):
            a, b, c = rng.integers(10, 99, 3)
            f.write(json.dumps({"prompt": f"what is {a} and {b}?", "chosen": f"it is {c} good",
                                "rejected": f"it is {c + 1} bad"}) + "\n")
    return path


def test_it_learns_an_easy_preference_and_reports_held_out_accuracy(tmp_path):
    t = rm_trainer(tmp_path, "data=preference", f"data.path={easy_pairs(tmp_path / 'pairs.jsonl')}",
                   "data.max_records=null", "objective.eval_pairs=16", "objective.eval_every=5",
                   "trainer.max_steps=12", "optimizer.lr=3e-3")
    held = {t.objective.heldout.pair_ids[i] for i in range(16)}
    assert t.objective.pairs.pairs == 32 and not held & set(t.objective.pairs.pair_ids)
    before = t.objective.heldout_accuracy()
    assert t.fit() == 0
    rows = [json.loads(line) for line in (t.run_dir / "history.jsonl").read_text().splitlines()]
    accs = {r["step"]: r["heldout/accuracy"] for r in rows if "heldout/accuracy" in r}
    assert sorted(accs) == [5, 10, 12]  # every 5 steps, and the last
    assert accs[12] >= 0.9 > before, (before, accs)


def test_held_out_pairs_must_leave_some_to_train_on(tmp_path):
    with pytest.raises(ConfigError, match="objective.eval_pairs"):
        rm_trainer(tmp_path, "objective.eval_pairs=1000")


# ----------------------------------------------------------------------------- export and the manifest


def test_the_export_loads_as_a_sequence_classifier_with_the_same_rewards(tmp_path):
    from transformers import AutoModelForSequenceClassification

    ov = [o for o in TINY_RM if o != "trainer.export=false"]
    t, run_dir = recorded_run(tmp_path, [*ov, "trainer.max_steps=2", f"data.cache_dir={tmp_path / 'c'}"], export=True)
    loaded = AutoModelForSequenceClassification.from_pretrained(run_dir / "export", dtype=torch.float32).eval()
    assert type(loaded).__name__ == "MistralForSequenceClassification"
    assert loaded.config.num_labels == 1 and loaded.config.pad_token_id == t.tokenizer.pad_token_id
    assert loaded.config.architectures == ["MistralForSequenceClassification"]
    obj = t.objective
    obj.model.eval()
    for b in obj._batches(obj.pairs):  # padded rows, several per batch: the pad rule matters
        b = b.to(t.env.device)
        with torch.no_grad():
            ours = torch.stack(obj.rewards(obj.forward, b), 1).reshape(-1)
            theirs = loaded(**b.model_inputs()).logits[:, 0]
        torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
    manifest = json.loads((run_dir / "provenance.json").read_text())
    o = manifest["objective"]
    assert o["head"]["class"] == "MistralForSequenceClassification" and o["head"]["num_labels"] == 1
    assert o["loss"] == "bradley_terry" and o["margin"]["present"] is False and o["gate"]["loss_ok"]
    assert manifest["serving"]["architecture"] == "MistralForSequenceClassification"


# ------------------------------------------------------------------------------------------- margins


def margin_pairs(path, margins):
    """Pairs whose line n carries margins[n - 1] (TRL's margin column)."""
    with open(path, "w") as f:
        for i, m in enumerate(margins):
            f.write(json.dumps({"prompt": f"what is {i} and {i + 3}?", "chosen": f"it is {2 * i + 3} good",
                                "rejected": f"it is {2 * i + 4} bad", "margin": m}) + "\n")
    return path


def test_a_run_on_pairs_with_margins_trains_on_trls_loss_with_them(tmp_path):
    """End to end: the loss step 1 logs is TRL's RewardTrainer.compute_loss on the rewards of that step's pairs and
    their margins as the file gives them (read here by line, not through align's arrays), and not the loss
    without them; the gate holds the margins the batch carries to those of the encoded pairs, and the manifest
    entry says the loss read them."""
    margins = [round(0.25 * i + 0.5, 2) for i in range(12)]
    t = rm_trainer(tmp_path, "data=preference", f"data.path={margin_pairs(tmp_path / 'pairs.jsonl', margins)}",
                   "data.max_records=null", "trainer.max_steps=1", "trainer.grad_accum=1")
    obj, b = t.objective, first_batch(t)
    from_file = torch.tensor([margins[int(obj.pairs.pair_ids[p].rsplit(":", 1)[1]) - 1] for p in b.pair_rows])
    torch.testing.assert_close(b.margin.cpu(), from_file.float(), atol=0, rtol=0)
    assert obj.gate(b)["loss_ok"] and obj.gate_report["margin"] is True
    dropped = dataclasses.replace(b, margin=None)  # a batch that lost its pairs' margins
    with pytest.raises(GateError, match="the pairs' margins"):
        obj.gate(dropped)

    was = obj.model.training
    with torch.no_grad():
        chosen, rejected = obj.rewards(obj.forward, b)
    obj.model.train(was)
    with_margin = trl_loss(chosen, rejected, from_file.float()).item()
    without = trl_loss(chosen, rejected).item()
    assert abs(with_margin - without) > 0.05  # the margins matter on this batch
    assert t.fit() == 0
    [row] = [json.loads(line) for line in (t.run_dir / "history.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["loss"] == pytest.approx(with_margin, rel=1e-5, abs=1e-6)
    d = obj.describe()["margin"]
    assert (d["present"], d["column"], d["pairs"], d["min"], d["max"]) == (True, "margin", 12, 0.5, 3.25)
