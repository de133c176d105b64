"""The DPO step-0 gate can fail: on the micro-batch step 1 trains on, before any update, the policy
equals its reference (log-ratio 0 on every pair) and every pair's batched log-probs equal its two
sequences forwarded alone. Each test plants ONE break and expects a GateError naming it: a wrong
reference (the frozen copy's weights perturbed), a mis-paired batch (sides or pairs permuted), a
misaligned mask (labels and seq_ids shifted by one), packed sequences that attend to each other.
A bf16 frozen copy (objective.reference_dtype=bf16) is the same reference in a smaller dtype: it
passes, and a wrong bf16 reference still fails. Trainers are built in-process from tiny configs."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from align.objectives.dpo import GateError
from tests.unit.objectives.conftest import dpo_trainer, first_batch


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    return dpo_trainer(tmp_path_factory.mktemp("gate"), "objective.reference=model")  # a copy the tests can break


def test_the_gate_passes_on_a_correct_start_and_reports_what_it_compared(trainer):
    report = trainer.objective.gate(first_batch(trainer))
    assert report["ran"] and report["batching_ok"] and report["reference_ok"]
    assert report["pairs"] == 4 and report["reference_why_null"] is None
    assert report["batching_max_abs_per_token"] <= report["tolerance_per_token"] == 1e-4
    assert report["reference_max_abs_per_token"] <= report["reference_tolerance_per_token"] == 1e-4


def test_a_wrong_reference_fails_the_gate(trainer):
    ref = trainer.objective.reference.module
    weight = ref.get_input_embeddings().weight
    saved = weight.detach().clone()
    with torch.no_grad():
        weight.add_(0.05 * torch.randn_like(weight))
    try:
        wrong = r"policy differs from its reference at step 0 by .* \(wrong reference\)"
        with pytest.raises(GateError, match=wrong) as e:
            trainer.objective.gate(first_batch(trainer))
        assert "batched log-probs" not in str(e.value)  # the pairs were right: only the reference is named
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    assert trainer.objective.gate(first_batch(trainer))["reference_ok"]  # restored: the control passes again


def _swap_sides(b):
    b.chosen_seq, b.rejected_seq = b.rejected_seq.clone(), b.chosen_seq.clone()


def _permute_pairs(b):
    b.pair_rows = np.roll(b.pair_rows, 1)


@pytest.mark.parametrize("break_batch", [_swap_sides, _permute_pairs], ids=["sides_swapped", "pairs_permuted"])
def test_a_mis_paired_batch_fails_the_gate(trainer, break_batch):
    b = first_batch(trainer)
    break_batch(b)
    with pytest.raises(GateError, match=r"batched log-probs differ from each sequence alone .*mis-paired batch"):
        trainer.objective.gate(b)


def test_a_mask_misaligned_by_one_token_fails_the_gate(trainer):
    b = first_batch(trainer)
    b.labels, b.seq_ids = b.labels.roll(1, dims=1), b.seq_ids.roll(1, dims=1)  # every target one position late
    with pytest.raises(GateError, match=r"batched log-probs differ from each sequence alone .*misaligned mask"):
        trainer.objective.gate(b)


def test_packed_sequences_that_attend_to_each_other_fail_the_gate(tmp_path):
    t = dpo_trainer(tmp_path, "sampler.packed=true")
    b = first_batch(t)
    assert b.packed and b.attention_mask is None
    assert t.objective.gate(copy.copy(b))["batching_ok"]  # restarting position ids, no mask: documents apart
    b.position_ids = None  # one causal document: every sequence now sees the ones packed before it
    with pytest.raises(GateError, match="attention across packed sequences"):
        t.objective.gate(b)


def test_a_bf16_frozen_copy_passes_at_bf16_tolerance_and_a_wrong_one_still_fails(tmp_path):
    t = dpo_trainer(tmp_path, "objective.reference=model", "objective.reference_dtype=bf16")
    ref = t.objective.reference.module
    assert next(ref.parameters()).dtype == torch.bfloat16 and next(t.model.parameters()).dtype == torch.float32
    report = t.objective.gate(first_batch(t))
    assert report["reference_ok"] and report["reference_tolerance_per_token"] == 5e-2
    assert report["reference_max_abs_per_token"] > 0  # bf16 rounding: not bit-equal, yet the same reference
    assert report["tolerance_per_token"] == 1e-4  # the batching check keeps the policy's precision
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    with pytest.raises(GateError, match="wrong reference"):
        t.objective.gate(first_batch(t))


def test_the_gate_reads_the_trainers_compute_dtype_not_the_devices_default(compose):
    """torch.get_autocast_dtype("cuda") is float16 whether or not a forward autocasts: a bf16 run read
    through it was held to the fp32 bound and refused on the GPU. The gate reads the trainer's rule."""
    import types

    import torch

    from align.config import Precision, to_typed
    from align.objectives.dpo import DPO
    from align.objectives.gate import BF16_TOLERANCE, FP32_TOLERANCE, tolerances
    from align.parallel.env import autocast_dtype

    assert autocast_dtype(Precision.auto, "cuda") == torch.bfloat16
    assert autocast_dtype(Precision.auto, "cpu") is None and autocast_dtype(Precision.bf16, "cpu") == torch.bfloat16
    for precision, want in (("bf16", BF16_TOLERANCE), ("fp32", FP32_TOLERANCE)):
        obj = DPO(to_typed(compose(["objective=dpo", f"trainer.precision={precision}"])))
        obj.model = types.SimpleNamespace(parameters=lambda: iter([torch.zeros(1)]))
        assert tolerances(obj)[0] == want, precision
