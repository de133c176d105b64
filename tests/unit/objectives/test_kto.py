"""objective=kto built in-process on the tiny model and the bundled pairs unpaired: it learns (desirable
completions' log-ratios rise above undesirable ones'), its step-0 gate holds the loss that runs to the loss
configured, the manifest records what resolved, and a resume on other labels is other data."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from align.errors import ConfigError
from align.objectives.gate import GateError, alone_sequence_logps
from align.objectives.kto_loss import kl_reference_point, kto_loss
from tests.unit.objectives.conftest import TINY_DPO, first_batch

TINY_KTO = ["objective=kto", *TINY_DPO[1:], "objective.beta=0.2", "objective.desirable_weight=1.5",
            "objective.undesirable_weight=0.5"]


def kto_trainer(root, *overrides: str):
    from align.config import to_typed
    from align.run.cli import compose
    from align.trainer import Trainer

    cfg = to_typed(compose([*TINY_KTO, f"data.cache_dir={root / 'cache' / 'encode'}", *overrides]))
    return Trainer.build(cfg, root / "run")


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    return kto_trainer(tmp_path_factory.mktemp("kto"), "objective.reference=model")


def margin(trainer) -> float:
    """Mean log-ratio to the reference of the desirable examples minus that of the undesirable ones."""
    obj = trainer.objective
    obj.model.eval()
    with torch.no_grad():
        rows = [obj.logps(obj.forward, b.to(trainer.env.device)) for b in obj._all_pairs()]
    obj.model.train()
    ratio = torch.cat([(x.policy - x.reference) for x in rows])
    d = torch.cat([x.desirable for x in rows])
    return (ratio[d].mean() - ratio[~d].mean()).item()


def test_the_gate_passes_and_holds_the_loss_to_the_configured_one(trainer):
    report = trainer.objective.gate(first_batch(trainer))
    assert report["batching_ok"] and report["reference_ok"] and report["loss_ok"], report
    labels = trainer.objective.pairs.labels[first_batch(trainer).pair_rows]
    assert 0 < labels.sum() < len(labels)  # both kinds of example in the batch the gate reads
    assert report["loss_expected"] == pytest.approx(1.5 / 2 * labels.sum() + 0.5 / 2 * (~labels).sum())


def _ignores_the_undesirable_weight(obj):
    return lambda x, reduce=None: kto_loss(x, kl_reference_point(x.policy_kl, x.reference_kl), beta=obj.cfg.beta,
                                           desirable_weight=obj.cfg.desirable_weight)


def _flips_the_labels(obj):
    loss_of = obj.loss_of
    return lambda x, reduce=None: loss_of(dataclasses.replace(x, desirable=~x.desirable), reduce)


def _kl_point_with_gradient(obj):
    def loss_of(x, reduce=None):
        kl = (x.policy_kl - x.reference_kl).mean()  # neither detached nor clamped
        return kto_loss(x, kl, beta=obj.cfg.beta, desirable_weight=obj.cfg.desirable_weight,
                        undesirable_weight=obj.cfg.undesirable_weight)
    return loss_of


def _ignores_beta(obj):
    return lambda x, reduce=None: kto_loss(x, kl_reference_point(x.policy_kl, x.reference_kl), beta=0.1,
                                           desirable_weight=obj.cfg.desirable_weight,
                                           undesirable_weight=obj.cfg.undesirable_weight)


def _ignores_the_kl_point(obj):
    return lambda x, reduce=None: kto_loss(x, kl_reference_point(x.policy_kl, x.reference_kl), beta=obj.cfg.beta,
                                           desirable_weight=obj.cfg.desirable_weight,
                                           undesirable_weight=obj.cfg.undesirable_weight, loss="apo_zero_unpaired")


@pytest.mark.parametrize("wrong", [_ignores_the_undesirable_weight, _flips_the_labels, _kl_point_with_gradient,
                                   _ignores_beta, _ignores_the_kl_point])
def test_a_loss_other_than_the_configured_one_fails_the_gate(trainer, monkeypatch, wrong):
    monkeypatch.setattr(trainer.objective, "loss_of", wrong(trainer.objective))
    with pytest.raises(GateError, match="the loss that runs is not the loss configured"):
        trainer.objective.gate(first_batch(trainer))


def test_the_manifest_records_what_resolved(trainer):
    d = trainer.objective.describe()
    assert (d["kind"], d["loss"], d["beta"], d["desirable_weight"], d["undesirable_weight"]) == ("kto", "kto", 0.2,
                                                                                                 1.5, 0.5)
    assert d["kl"]["in_loss"] is True
    assert d["reference"]["requested"] == d["reference"]["resolved"] == "model"
    assert d["reference"]["weights_sha256"] and d["reference"]["dtype"] == "same"
    data = trainer.objective.pairs
    assert d["data"] == {"examples": data.pairs, "desirable": int(data.labels.sum()),
                         "undesirable": int((~data.labels).sum()), "truncated_examples": 0}
    assert d["data"]["desirable"] == d["data"]["undesirable"]  # the bundled pairs, each side one example


@pytest.fixture(scope="module")
def apo(tmp_path_factory):
    return kto_trainer(tmp_path_factory.mktemp("apo"), "objective.loss=apo_zero_unpaired")


def test_apo_zero_unpaired_passes_its_gate_and_fails_kto_s_loss_in_its_place(apo, monkeypatch):
    """The gate holds apo_zero_unpaired's loss, which reads no KL point: kto's (which does) fails it."""
    obj = apo.objective
    report = obj.gate(first_batch(apo))
    assert report["loss_ok"] and report["loss"] == "apo_zero_unpaired", report
    assert report["loss_kl_shifted"] == pytest.approx(report["loss_expected"], rel=1e-5)  # the point moved nothing
    monkeypatch.setattr(obj, "loss_of", lambda x, reduce=None: kto_loss(
        x, kl_reference_point(x.policy_kl, x.reference_kl), beta=obj.cfg.beta,
        desirable_weight=obj.cfg.desirable_weight, undesirable_weight=obj.cfg.undesirable_weight))
    with pytest.raises(GateError, match="apo_zero_unpaired reads no KL point"):
        obj.gate(first_batch(apo))


def test_apo_zero_unpaired_trains_its_loss_and_the_manifest_records_it(apo):
    """micro_loss is apo_zero_unpaired's: with the policy moved off its reference, it differs from kto's on the
    same log-probs (whose KL point is not 0) and equals the definition recomputed by hand."""
    obj, b = apo.objective, first_batch(apo)
    with torch.no_grad():
        for p in obj.model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
        x = obj.logps(obj.forward, b)
        ran = obj.micro_loss(obj.forward, b).item()
    r, beta, d = (x.policy - x.reference).double(), obj.cfg.beta, x.desirable
    want = torch.where(d, 1.5 * (1 - torch.sigmoid(beta * r)), 0.5 * torch.sigmoid(beta * r)).sum().item()
    kl = kl_reference_point(x.policy_kl, x.reference_kl)
    kto = kto_loss(x, kl, beta=beta, desirable_weight=1.5, undesirable_weight=0.5).losses.sum().item()
    assert kl.item() > 0 and ran == pytest.approx(want, rel=1e-5) and ran != pytest.approx(kto, rel=1e-3)
    d = obj.describe()
    assert d["loss"] == "apo_zero_unpaired" and d["kl"]["in_loss"] is False
    assert "sigmoid(beta r)" in d["loss_definition"]


def test_desirable_completions_rise_relative_to_undesirable_ones(tmp_path):
    t = kto_trainer(tmp_path, "trainer.max_steps=12", "objective.beta=0.5", "sampler.micro_batch_size=8")
    before = margin(t)
    assert t.fit() == 0
    after = margin(t)
    assert abs(before) < 1e-4 and after > 0.3, (before, after)

    # The KL point the run computes is that of each example's KL sequence forwarded alone (gate.py's
    # independent path), not of its completion: the two differ once the policy has moved.
    obj, b = t.objective, first_batch(t)
    obj.model.eval()
    with torch.no_grad():
        x = obj.logps(obj.forward, b)
        alone = alone_sequence_logps(obj, [int(p) for p in b.pair_rows])
    kl = obj.loss_of(x).kl.item()
    assert kl == pytest.approx((alone[1::2] - x.reference_kl).mean().clamp(min=0).item(), abs=1e-4)
    assert kl != pytest.approx((alone[0::2] - x.reference).mean().clamp(min=0).item(), abs=1e-3)


def test_a_resume_on_other_labels_is_other_data_and_on_another_reference_is_refused(trainer, tmp_path, tokenizer):
    """The resume identity's dataset fingerprint covers the labels (negative control: the same labels give
    the same fingerprint), and the checkpoint's reference identity is held as DPO's is."""
    from align.data.encode import dataset_fingerprint
    from align.data.unpaired import load_examples_encoded
    from tests.unit.data.conftest import write_jsonl
    from tests.unit.data.test_preference import train_cfg

    rows = [{"prompt": f"what is {i} + 1?", "completion": f"it is {i + 1}", "label": i % 2 == 0} for i in range(4)]

    def fingerprint(name, labels):
        d = tmp_path / name
        d.mkdir()
        records = [{**r, "label": v} for r, v in zip(rows, labels)]
        cfg = train_cfg(d, write_jsonl(d / "kto.jsonl", records), objective="kto")
        return dataset_fingerprint(load_examples_encoded(cfg, tokenizer))

    labels = [r["label"] for r in rows]
    assert fingerprint("a", labels) == fingerprint("b", labels)
    assert fingerprint("c", labels) != fingerprint("d", [not v for v in labels])

    state = trainer.objective.state_dict()
    trainer.objective.load_state_dict(state)
    with pytest.raises(ConfigError, match="the checkpoint was trained against"):
        trainer.objective.load_state_dict({**state, "reference_sha256": "0" * 64})
