"""Bit-exact resume on 2 gloo ranks (parallel=fsdp): 20 micro-steps uninterrupted vs stopped after
micro-step 10 and resumed. Final parameters bit-identical, losses identical at every step.

The negative controls live here too, so the comparison is shown to see the difference it exists for:
resuming with the two ranks' optimizer shards swapped, or without restoring the sampler position,
must make the same comparison fail. (Swapping the two ranks' DCP files on disk does not even load:
DCP reads each item at its recorded offset and the files' layouts differ, so it fails loudly.)
All runs share one spawn of 2 processes.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.integration.distributed import TINY, fit_many, history, result, run

ACCUM, STEPS, STOP = 2, 10, 5  # 20 micro-steps; the stop lands after micro-step 10
VARIANTS = {"ep": ["model=olmoe", "parallel=ep"], "adamw8bit": ["parallel=fsdp", "optimizer=adamw8bit"]}
CFG = TINY + ["parallel=fsdp", f"trainer.grad_accum={ACCUM}", f"trainer.max_steps={STEPS}", "trainer.export=true"]


# ----------------------------------------------------------- hooks (module level: spawn pickles them)


def request_stop_before(trainer, rank: int, step: int, on_rank: int) -> None:
    """Ask ONE rank to stop while it computes `step`, as its signal handler would."""
    if rank != on_rank:
        return
    inner = trainer.train_step

    def train_step(batches):
        if trainer.state.step == step - 1:
            trainer.stop.request(f"test: stop during step {step} on rank {on_rank}")
        return inner(batches)

    trainer.train_step = train_step


def forget_sampler_position(trainer, rank: int) -> None:
    """A resume that restores everything but the data position (the bug LANDMINES 21 describes)."""
    from align.data.loader import Position

    assert trainer.state.step == STOP, "the control must start from the resumed checkpoint"
    trainer.stream.position = Position()


def swap_optimizer_shards(trainer, rank: int) -> None:
    """After the resume: each rank takes the OTHER rank's shard of every optimizer state tensor."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    assert trainer.state.step == STOP, "the control must start from the resumed checkpoint"
    swapped = 0
    for state in trainer.optimizer.state.values():
        for v in state.values():
            if isinstance(v, DTensor):
                mine = v.to_local()
                both = [torch.empty_like(mine) for _ in range(2)]
                dist.all_gather(both, mine.contiguous())
                mine.copy_(both[1 - rank])
                swapped += 1
    assert swapped > 0


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
    root = tmp_path_factory.mktemp("resume")
    d = {k: str(root / k) for k in ("full", "stopped", "swapped", "nosampler")}
    keep = ["trainer.save_every=2", "trainer.keep_last=2"]
    jobs = [
        {"run_dir": d["full"], "overrides": CFG},
        {"run_dir": d["stopped"], "overrides": CFG + keep,
         "hook": functools.partial(request_stop_before, step=STOP, on_rank=1),
         "after": functools.partial(copy_stop_checkpoint, src=d["stopped"], dsts=(d["swapped"], d["nosampler"]))},
        {"run_dir": d["stopped"], "overrides": CFG + keep},  # the resume: same command, same run dir
        {"run_dir": d["swapped"], "overrides": CFG, "hook": swap_optimizer_shards},
        {"run_dir": d["nosampler"], "overrides": CFG, "hook": forget_sampler_position},
    ]
    # The same stop + resume for the other layouts a checkpoint must survive: expert parallel (experts
    # on their own mesh) and torchao's 8-bit AdamW under FSDP (LANDMINES 17); 6 steps, stop after 3.
    for name, extra in VARIANTS.items():
        cfg = TINY + [f"trainer.grad_accum=1", "trainer.max_steps=6", "trainer.export=true", *extra]
        d[f"{name}_full"], d[f"{name}_stopped"] = str(root / f"{name}_full"), str(root / f"{name}_stopped")
        jobs += [{"run_dir": d[f"{name}_full"], "overrides": cfg},
                 {"run_dir": d[f"{name}_stopped"], "overrides": cfg, "hook": functools.partial(request_stop_before, step=3, on_rank=0)},
                 {"run_dir": d[f"{name}_stopped"], "overrides": cfg}]
    codes = run(fit_many, 2, jobs, str(root / "codes.json"), timeout=600)
    assert codes == [0, 0]
    return {k: Path(v) for k, v in d.items()}, json.loads((root / "codes.json").read_text())


def differences(ref: Path, other: Path) -> list[str]:
    """Every way `other` departs from `ref`: a loss at a step both logged, or a final parameter."""
    out = []
    mine = {r["step"]: r["loss"] for r in history(other)}
    for r in history(ref):
        if r["step"] in mine and mine[r["step"]] != r["loss"]:
            out.append(f"loss at step {r['step']}: {r['loss']!r} vs {mine[r['step']]!r}")
    a, b = load_file(ref / "export" / "model.safetensors"), load_file(other / "export" / "model.safetensors")
    assert a.keys() == b.keys()
    out += [f"param {k}" for k in a if not torch.equal(a[k], b[k])]
    return out


# ------------------------------------------------------------------------------------ tests


def test_stop_then_resume_is_bit_identical_to_the_uninterrupted_run(runs):
    dirs, codes = runs
    assert codes[:3] == [0, 143, 0]
    rows = history(dirs["stopped"])
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # one row per step across both attempts
    assert len(history(dirs["full"])) == STEPS
    assert differences(dirs["full"], dirs["stopped"]) == []
    assert result(dirs["stopped"], 0)["model_info"]["resumed_from"]["step"] == STOP
    assert result(dirs["stopped"], 1)["model_info"]["resumed_from"]["step"] == STOP


def test_negative_control_swapped_optimizer_shards_is_detected(runs):
    dirs, codes = runs
    assert codes[3] == 0
    diff = differences(dirs["full"], dirs["swapped"])
    assert any(d.startswith("param") for d in diff), diff


def test_negative_control_resume_without_sampler_state_is_detected(runs):
    dirs, codes = runs
    assert codes[4] == 0
    diff = differences(dirs["full"], dirs["nosampler"])
    assert any(d.startswith("loss") for d in diff) and any(d.startswith("param") for d in diff), diff


def test_keep_last_is_honoured_across_the_resume(runs):
    dirs, _ = runs
    # attempt 1 wrote 2, 4 and the stop checkpoint 5; attempt 2 adopted them and wrote 6, 8, 10
    left = sorted(p.name for p in (dirs["stopped"] / "checkpoints").iterdir())
    assert left == ["step_00000008", "step_00000010"]


def test_the_stop_checkpoint_is_complete_and_says_why(runs):
    dirs, _ = runs
    from align.control.ckpt_index import problem

    ckpt = dirs["swapped"] / "checkpoints" / f"step_{STOP:08d}"  # the copy of the stop checkpoint
    assert problem(ckpt) is None
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["reason"] == "stop" and meta["step"] == STOP and meta["world_size"] == 2
    assert meta["state"]["step"] == STOP
    for r in (0, 1):
        rank = json.loads((ckpt / f"rank{r}.json").read_text())
        assert rank["stream"]["index"] == STOP * ACCUM  # micro-batches this rank consumed


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_expert_parallel_and_8bit_adamw_resume_bit_exactly_too(runs, name):
    dirs, codes = runs
    at = 5 + 3 * sorted(VARIANTS).index(name)
    assert codes[at:at + 3] == [0, 143, 0]
    assert [r["step"] for r in history(dirs[f"{name}_stopped"])] == list(range(1, 7))
    assert differences(dirs[f"{name}_full"], dirs[f"{name}_stopped"]) == []
    info = result(dirs[f"{name}_stopped"], 0)["model_info"]
    assert info["resumed_from"]["step"] == 3
    if name == "adamw8bit":
        assert info["optimizer_impl"] == "torchao.optim.adam.AdamW8bit"
    else:  # the export gathered every expert from both ranks, in the hub layout transformers loads
        assert info["parallel"]["ep_size"] == 2
        sd = load_file(dirs[f"{name}_full"] / "export" / "model.safetensors")
        assert {k.split(".")[5] for k in sd if ".mlp.experts." in k} == {str(e) for e in range(8)}
