"""The three reference strategies of the preference objective, built in-process on the tiny model.

precomputed: the starting policy's log-probs, computed once and cached under a key of what they
mean. The same config in a new run dir hits the same entry; other weights (trainer.seed), other
masks (data.max_seq_len) or another model config (an rms_norm_eps override, which the weights' hash
does not see) get another key; a stale entry under the right key is caught by the step-0 gate; a
resume whose entry is gone is refused (the policy has moved: it cannot be recomputed).
adapters_off: LoRA's base with the adapters disabled: the objective and the trainer hold no second
model (a walk over what they reference finds the frozen copy of reference=model, the control, and
nothing for adapters_off), and after training the reference still equals a freshly built base.
"""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from align.config import ReferenceKind
from align.errors import ConfigError
from align.objectives.dpo import GateError
from tests.unit.objectives.conftest import dpo_trainer, first_batch

PRECOMPUTED = ["objective.reference=precomputed"]


def describe_ref(trainer) -> dict:
    return trainer.objective.describe()["reference"]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("reference")


@pytest.fixture(scope="module")
def first(root):
    """The first precomputed build under a fresh cache: a miss, computed and written."""
    return build(root, "a")


def build(root: Path, name: str, *overrides: str):
    return dpo_trainer(root / name, *PRECOMPUTED, f"data.cache_dir={root / 'cache' / 'encode'}", *overrides)


def test_a_first_build_computes_and_caches_and_the_gate_passes_against_it(first, root):
    ref = describe_ref(first)
    assert ref["resolved"] == "precomputed" and ref["cache_hit"] is False
    assert Path(ref["cache_path"]) == root / "cache" / "reference" / f"{ref['cache_key']}.npy"
    assert Path(ref["cache_path"]).is_file()
    assert ref["weights_sha256"] == first.objective.reference_sha256 and len(ref["weights_sha256"]) == 64
    assert ref["path"] is None and "random init" in ref["path_why_null"]
    assert first.objective.gate(first_batch(first))["reference_ok"]


def test_the_same_config_in_a_new_run_dir_hits_the_same_entry(first, root):
    again = build(root, "b")
    a, b = describe_ref(first), describe_ref(again)
    assert b["cache_hit"] is True and b["cache_key"] == a["cache_key"]
    assert torch.equal(again.objective.reference.table, first.objective.reference.table)


@pytest.mark.parametrize("override,what", [("trainer.seed=1", "weights"), ("data.max_seq_len=192", "masks"),
                                           ("+model.overrides.rms_norm_eps=0.01", "model_config")])
def test_other_weights_masks_or_model_config_get_another_key(first, root, override, what):
    other = build(root, what, override)
    a, b = describe_ref(first), describe_ref(other)
    assert b["cache_key"] != a["cache_key"] and b["cache_hit"] is False
    same_weights = b["weights_sha256"] == a["weights_sha256"]
    same_encode = other.data.meta["encode_cache_key"] == first.data.meta["encode_cache_key"]
    # each change moves the key through the part it should, and only that part
    assert (same_weights, same_encode) == {"weights": (False, True), "masks": (True, False),
                                           "model_config": (True, True)}[what]


def test_a_stale_entry_under_the_right_key_is_caught_by_the_gate(first, root):
    path = Path(describe_ref(first)["cache_path"])
    good = np.load(path)
    try:
        np.save(path, good + np.float32(0.5))  # log-probs of some other reference
        stale = build(root, "stale")
        assert describe_ref(stale)["cache_hit"] is True
        with pytest.raises(GateError, match="wrong reference"):
            stale.objective.gate(first_batch(stale))
    finally:
        np.save(path, good)


def test_a_resume_whose_entry_is_gone_is_refused(root):
    t = build(root, "gone", "trainer.seed=2")
    path = Path(describe_ref(t)["cache_path"])
    path.unlink()
    with pytest.raises(ConfigError, match="is missing and the policy has trained since"):
        t.objective.bind(t.model, t.forward, resuming=True)
    assert not path.exists()  # nothing computed from a policy that is not the starting one


# ------------------------------------------------------------------------------- adapters_off


def foreign_modules(trainer) -> list[torch.nn.Module]:
    """Modules reachable from the trainer (through its objective too) that are not the policy or part of it."""
    policy = {id(m) for m in trainer.model.modules()}
    found, seen, stack = [], set(), [(trainer, 0)]
    while stack:
        x, depth = stack.pop()
        if id(x) in seen or depth > 8 or isinstance(x, (str, bytes, int, float, np.ndarray, torch.Tensor, type)):
            continue
        seen.add(id(x))
        if isinstance(x, torch.nn.Module):
            if id(x) not in policy:
                found.append(x)
            continue  # a module's own children are its business
        if isinstance(x, types.MethodType):
            stack.append((x.__self__, depth + 1))
        elif isinstance(x, dict):
            stack += [(v, depth + 1) for v in x.values()]
        elif isinstance(x, (list, tuple, set)):
            stack += [(v, depth + 1) for v in x]
        elif hasattr(x, "__dict__") and type(x).__module__.split(".")[0] in ("align", "torch"):
            stack += [(v, depth + 1) for v in vars(x).values()]
    return found


@pytest.fixture(scope="module")
def lora(root):
    return dpo_trainer(root / "lora", "model.lora.enabled=true", "optimizer.lr=1e-2")


def test_adapters_off_holds_no_second_model_and_a_frozen_copy_does(lora, root):
    assert lora.objective.reference_kind == ReferenceKind.adapters_off
    assert lora.objective.reference.policy is lora.model
    assert foreign_modules(lora) == []
    # the control: the same walk finds reference=model's frozen copy, as large as the policy
    copy_run = dpo_trainer(root / "copy", "model.lora.enabled=true", "objective.reference=model")
    [frozen] = foreign_modules(copy_run)
    assert frozen is copy_run.objective.reference.module
    assert sum(p.numel() for p in frozen.parameters()) == sum(p.numel() for p in copy_run.model.parameters())


def test_adapters_off_is_the_base_model_before_and_after_training(lora):
    from tests.conftest import build_tiny

    obj = lora.objective
    assert obj.gate(first_batch(lora))["reference_ok"]
    lora.cfg.trainer.max_steps = 3
    assert lora.fit() == 0
    batch = first_batch(lora)
    with torch.no_grad():
        rc, rr = obj.reference_logps(lora.forward, batch)
        policy = obj.sequence_logps(lora.forward, batch)
    # the base, built afresh from the same config and seed without LoRA
    cfg = lora.cfg
    plain = dataclasses.replace(cfg.model, lora=dataclasses.replace(cfg.model.lora, enabled=False))
    base = build_tiny(plain, cfg.attention, seed=cfg.trainer.seed).model.eval()
    with torch.no_grad():
        want = obj.sequence_logps(lora.forward, batch, module=base)
    assert torch.allclose(rc, want[batch.chosen_seq], atol=1e-5, rtol=0)
    assert torch.allclose(rr, want[batch.rejected_seq], atol=1e-5, rtol=0)
    # the adapters did train: the policy has left its reference
    assert (policy[batch.chosen_seq] - rc).abs().max() > 1e-3
