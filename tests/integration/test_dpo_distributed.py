"""The preference objective on 2 gloo ranks (parallel=fsdp), all jobs in one spawn of 2 processes.

- Parity: 2 ranks x 1 micro-batch of 2 pairs per window train what one process trains with 2
  micro-batches per window: losses, gradient norms and the reward metrics of 4 steps agree to 1e-5.
  The frozen reference (reference=model) is sharded exactly like the policy, and the step-0 gate runs
  collectively and passes on both ranks; reference=precomputed computes its table collectively too.
- Bit-exact resume: 8 steps uninterrupted vs a stop requested on rank 1 during step 4 (both ranks exit
  143 with one stop checkpoint) and a resume: one history row per step, identical losses and final
  parameters. Negative controls: a resume that forgets the sampler position differs; a resume whose
  reference weights are not the run's (model.pretrained = another model) is refused (exit 2) before
  anything is written.
- Non-finite: NaN in rank 1's loss from step 2 halts both ranks with exit 81 and HALT.json.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.integration.distributed import fit, fit_many, history, result, run
from tests.integration.test_resume_exact import request_stop_before

STEPS, STOP, ACCUM = 8, 4, 2


def dpo_cfg(root: Path, *extra: str) -> list[str]:
    return ["objective=dpo", "logger=none", "trainer.device=cpu", "trainer.export=false", "trainer.log_every=1000",
            "data.max_records=60", "data.max_seq_len=160", "data.truncation=drop", "data.on_bad_record=skip",
            "sampler=shuffle", "sampler.micro_batch_size=2", "optimizer.warmup_ratio=0", "optimizer.lr=3e-3",
            f"data.cache_dir={root / 'cache' / 'encode'}", *extra]


# ----------------------------------------------------------- hooks (module level: spawn pickles them)


def gate_and_sharding(trainer, rank: int) -> None:
    """Run the step-0 gate as the CLI does (collective under FSDP) and record how the reference is laid out."""
    from torch.distributed.tensor import DTensor

    obj = trainer.objective
    out = {"gate": obj.gate(trainer.stream.peek().to(trainer.env.device)), "reference": obj.describe()["reference"]}
    ref = getattr(obj.reference, "module", None)
    if ref is not None:
        policy = dict(trainer.model.named_parameters())

        def layout(p):
            return [str(p.placements), list(p.to_local().shape)] if isinstance(p, DTensor) else None

        out["layout"] = {n: [layout(p), layout(policy[n])] for n, p in ref.named_parameters()}
    (Path(trainer.run_dir) / f"rank{rank}" / "dpo.json").write_text(json.dumps(out, default=str))


def copy_stop_checkpoint(rank: int, world: int, src: str, dsts: tuple[str, ...]) -> None:
    import torch.distributed as dist

    if rank == 0:
        ckpt = Path(src) / "checkpoints" / f"step_{STOP:08d}"
        for dst in dsts:
            shutil.copytree(ckpt, Path(dst) / "checkpoints" / ckpt.name)
    dist.barrier()


# ------------------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dpo2")
    d = {k: root / k for k in ("parity", "precomputed", "full", "stopped", "nosampler", "otherref", "nan", "single")}
    fsdp = ["parallel=fsdp"]
    # reference=model pinned: auto would precompute for runs that read a whole epoch of these pairs
    resume = dpo_cfg(root, *fsdp, f"trainer.grad_accum={ACCUM}", f"trainer.max_steps={STEPS}", "trainer.export=true",
                     "objective.reference=model")
    keep = ["trainer.save_every=2", "trainer.keep_last=2"]
    jobs = [
        {"run_dir": str(d["parity"]),
         "overrides": dpo_cfg(root, *fsdp, "trainer.max_steps=4", "objective.reference=model"),
         "hook": gate_and_sharding},
        {"run_dir": str(d["precomputed"]), "overrides": dpo_cfg(root, *fsdp, "trainer.max_steps=2",
                                                                 "objective.reference=precomputed"),
         "hook": gate_and_sharding},
        {"run_dir": str(d["full"]), "overrides": resume},
        {"run_dir": str(d["stopped"]), "overrides": resume + keep,
         "hook": functools.partial(request_stop_before, step=STOP, on_rank=1),
         "after": functools.partial(copy_stop_checkpoint, src=str(d["stopped"]),
                                    dsts=(str(d["nosampler"]), str(d["otherref"])))},
        {"run_dir": str(d["stopped"]), "overrides": resume + keep},  # the resume: same command, same run dir
        {"run_dir": str(d["nosampler"]), "overrides": resume, "hook": forget_sampler_position},
        # another starting model: the export of the full run (same shape, same tokenizer, other weights)
        {"run_dir": str(d["otherref"]), "overrides": resume + [f"model.pretrained={d['full'] / 'export'}"]},
        {"run_dir": str(d["nan"]), "overrides": dpo_cfg(root, *fsdp, "trainer.max_steps=4",
                                                         "trainer.max_consecutive_skipped_steps=1"),
         "env": {"ALIGN_TEST_INJECT_NAN": "1:2-"}},
    ]
    assert run(fit_many, 2, jobs, str(root / "codes.json"), timeout=540) == [0, 0]
    # the single-process reference of the parity job: the same global window as 2 micro-batches
    assert fit(0, 1, str(d["single"]), dpo_cfg(root, "trainer.max_steps=4", "trainer.grad_accum=2")) == 0
    return d, json.loads((root / "codes.json").read_text())


def forget_sampler_position(trainer, rank: int) -> None:
    """A resume that restores everything but the data position."""
    from align.data.loader import Position

    assert trainer.state.step == STOP, "the control must start from the resumed checkpoint"
    trainer.stream.position = Position()


def differences(ref: Path, other: Path) -> list[str]:
    out = []
    mine = {r["step"]: r for r in history(other)}
    for r in history(ref):
        o = mine.get(r["step"])
        if o is not None:
            out += [f"{k} at step {r['step']}" for k in ("loss", "rewards/margin", "logps/chosen") if o[k] != r[k]]
    a, b = load_file(ref / "export" / "model.safetensors"), load_file(other / "export" / "model.safetensors")
    assert a.keys() == b.keys()
    return out + [f"param {k}" for k in a if not torch.equal(a[k], b[k])]


# ------------------------------------------------------------------------------------ tests


def test_two_ranks_match_one_process_to_1e5(runs):
    d, codes = runs
    assert codes[0] == 0
    ref, got = history(d["single"]), history(d["parity"])
    assert [r["step"] for r in got] == [1, 2, 3, 4] == [r["step"] for r in ref]
    for a, b in zip(ref, got):
        assert a["pairs"] == b["pairs"] == 4  # the window is the whole single-process window, both ranks
        for k in ("loss", "rewards/chosen", "rewards/rejected", "rewards/margin", "rewards/accuracy"):
            assert abs(a[k] - b[k]) < 1e-5, (a["step"], k, a[k], b[k])
        for k in ("grad_norm", "logps/chosen", "logps/rejected"):
            assert abs(a[k] - b[k]) < 1e-5 * abs(a[k]), (a["step"], k, a[k], b[k])
    assert ref[-1]["rewards/margin"] != 0  # the policy moved off its reference: a comparison of a moving model


def test_the_frozen_reference_is_sharded_like_the_policy_and_the_gate_passes_on_both_ranks(runs):
    d, _ = runs
    assert result(d["parity"], 0)["model_info"]["parallel"]["kind"] == "fsdp"
    for r in (0, 1):
        out = json.loads((d["parity"] / f"rank{r}" / "dpo.json").read_text())
        assert out["gate"]["ran"] and out["gate"]["batching_ok"] and out["gate"]["reference_ok"]
        assert out["reference"]["resolved"] == "model"
        layout = out["layout"]
        assert all(ref == pol for ref, pol in layout.values()), layout  # placements and local shard shapes
        sharded = [n for n, (ref, _) in layout.items() if ref is not None and "Shard(dim=0)" in ref[0]]
        assert sum(".layers." in n for n in sharded) == sum(".layers." in n for n in layout) > 0


def test_a_precomputed_reference_is_computed_collectively_and_its_gate_passes_on_both_ranks(runs):
    d, codes = runs
    assert codes[1] == 0
    outs = [json.loads((d["precomputed"] / f"rank{r}" / "dpo.json").read_text()) for r in (0, 1)]
    assert outs[0]["reference"]["cache_key"] == outs[1]["reference"]["cache_key"]
    assert all(o["gate"]["reference_ok"] and o["reference"]["cache_hit"] is False for o in outs)
    assert Path(outs[0]["reference"]["cache_path"]).is_file() and "layout" not in outs[0]


def test_stop_then_resume_is_bit_identical_to_the_uninterrupted_run(runs):
    d, codes = runs
    assert codes[2:5] == [0, 143, 0]
    assert [r["step"] for r in history(d["stopped"])] == list(range(1, STEPS + 1))
    assert differences(d["full"], d["stopped"]) == []
    for r in (0, 1):
        assert result(d["stopped"], r)["model_info"]["resumed_from"]["step"] == STOP
    # the stop checkpoint (its copy) holds the reference the run trained against: a resume is checked on it
    meta = json.loads((d["otherref"] / "checkpoints" / f"step_{STOP:08d}" / "meta.json").read_text())
    start = json.loads((d["parity"] / "rank0" / "dpo.json").read_text())["reference"]["weights_sha256"]
    assert meta["reason"] == "stop" and meta["objective"] == {"reference": "model", "reference_sha256": start,
                                                              "reference_cache_key": None}


def test_negative_control_a_resume_that_forgets_the_sampler_position_differs(runs):
    d, codes = runs
    assert codes[5] == 0
    diff = differences(d["full"], d["nosampler"])
    assert any(x.startswith("loss") for x in diff) and any(x.startswith("param") for x in diff), diff


def test_negative_control_a_resume_against_other_reference_weights_is_refused(runs):
    d, codes = runs
    assert codes[6] == 2
    outcomes = [result(d["otherref"], r) for r in (0, 1)]
    assert [o["code"] for o in outcomes] == [2, 2]
    error = outcomes[0]["error"]
    assert error.startswith("objective.reference_sha256: the checkpoint was trained against ") and \
        "resume with the run's own reference" in error
    assert not (d["otherref"] / "history.jsonl").exists() and not (d["otherref"] / "export").exists()


def test_nan_on_one_rank_halts_both_with_81(runs):
    d, codes = runs
    assert codes[7] == 81
    outcomes = [result(d["nan"], r) for r in (0, 1)]
    assert [o["code"] for o in outcomes] == [81, 81] and outcomes[0]["error"] == outcomes[1]["error"]
    error = outcomes[0]["error"]
    assert "2 consecutive non-finite optimizer steps exceed trainer.max_consecutive_skipped_steps=1" in error
    halt = json.loads((d["nan"] / "HALT.json").read_text())
    assert halt["code"] == 81 and halt["step"] == 3 and halt["message"] == error
    assert "non-finite loss on 1 rank(s)" in halt["skip_stats"]["last_cause"]
    rows = history(d["nan"])
    assert [r["skipped"] for r in rows] == [False, True, True]
    assert math.isfinite(rows[0]["rewards/margin"]) and not (d["nan"] / "checkpoints").exists()
