"""`objective.reference=auto` for DPO: the LoRA base under LoRA; otherwise precomputed log-probs where
the run reads every pair at least once (one reference forward per pair up front, and no second copy
of the weights), a frozen copy where it reads less; the copy too before the pair stream is planned,
so the memory estimate counts the upper bound. The manifest says which and why."""

from __future__ import annotations

import pytest

from align.config import ReferenceKind, to_typed
from align.objectives.reference import preference_reference_why
from align.run.cli import compose
from tests.unit.objectives.conftest import TINY_DPO, dpo_trainer


def _cfg(*overrides: str):
    return to_typed(compose([*TINY_DPO, *overrides]))


@pytest.mark.parametrize("epochs, kind", [(None, ReferenceKind.model), (0.99, ReferenceKind.model),
                                          (1.0, ReferenceKind.precomputed), (7.5, ReferenceKind.precomputed)])
def test_auto_precomputes_from_one_epoch_on(epochs, kind):
    got, why = preference_reference_why(_cfg(), epochs)
    assert got == kind and why.startswith("auto: ")


def test_auto_keeps_the_lora_base_and_an_explicit_choice_and_a_reference_free_loss():
    assert preference_reference_why(_cfg("model.lora.enabled=true"), 5.0)[0] == ReferenceKind.adapters_off
    assert preference_reference_why(_cfg("objective.reference=model"), 5.0) == (ReferenceKind.model, "as given")
    assert preference_reference_why(_cfg("objective.loss=simpo"), 5.0) == (None, "loss=simpo is reference-free")


def test_the_built_objective_resolves_auto_from_the_planned_stream(tmp_path):
    short = dpo_trainer(tmp_path / "short", "trainer.max_steps=1")
    long = dpo_trainer(tmp_path / "long", "trainer.max_steps=60")
    micro_batches = len(short.stream.sampler.inner.rank_batches(0))
    assert 1 < micro_batches < 60  # one step reads less than an epoch, sixty read more
    ref = short.objective.describe()["reference"]
    assert (ref["resolved"], ref["cache_key"]) == ("model", None)
    assert f"{1 / micro_batches:.2f} of an epoch" in ref["why"]
    ref = long.objective.describe()["reference"]
    assert ref["resolved"] == "precomputed" and ref["cache_key"] and f"{60 / micro_batches:.2f} epochs" in ref["why"]
    assert long.objective.gate(long.stream.peek().to(long.env.device))["reference_ok"]
