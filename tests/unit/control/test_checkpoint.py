"""Checkpoint files: complete-or-absent, pruning that adopts older checkpoints, a bit-exact
single-process round trip, and a metadata reader that refuses to run code from a checkpoint."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from align.control import ckpt_index
from align.control.checkpoint import load_checkpoint, merge, partition, remove_stale_tmp, save_checkpoint
from align.parallel.env import DistEnv

ENV = DistEnv(rank=0, world=1, local_rank=0, device=torch.device("cpu"))


def _fake(root: Path, step: int, world: int = 1, skip: str | None = None) -> Path:
    d = root / ckpt_index.checkpoint_name(step)
    for part in ("model", "optim"):
        (d / part).mkdir(parents=True)
        if skip != f"{part}/.metadata":
            (d / part / ".metadata").write_text("x")
    if skip != "meta.json":
        (d / "meta.json").write_text(json.dumps({"world_size": world}))
    for r in range(world):
        if skip != f"rank{r}.json":
            (d / f"rank{r}.json").write_text("{}")
    return d


@pytest.mark.parametrize("skip", ["model/.metadata", "optim/.metadata", "meta.json", "rank1.json"])
def test_a_checkpoint_missing_any_part_does_not_count(tmp_path, skip):
    _fake(tmp_path, 3, world=2)
    bad = _fake(tmp_path, 5, world=2, skip=skip)
    assert ckpt_index.problem(bad) is not None
    assert ckpt_index.newest(tmp_path)[0] == 3


def test_an_unrenamed_tmp_dir_does_not_count_and_is_cleaned(tmp_path):
    _fake(tmp_path, 3)
    tmp = _fake(tmp_path, 5)
    tmp.rename(tmp_path / "step_00000005.tmp")
    assert ckpt_index.newest(tmp_path)[0] == 3
    assert remove_stale_tmp(tmp_path) == [tmp_path / "step_00000005.tmp"]
    assert not (tmp_path / "step_00000005.tmp").exists()


def test_pruning_adopts_older_checkpoints_and_leaves_newer_ones(tmp_path):
    for s in (2, 4, 6, 8, 20):  # 20: left by an attempt that got further than the one we resumed
        _fake(tmp_path, s)
    assert ckpt_index.to_prune(tmp_path, keep_last=2, upto_step=8) == [tmp_path / "step_00000002",
                                                                        tmp_path / "step_00000004"]
    assert ckpt_index.to_prune(tmp_path, keep_last=0, upto_step=8) == []


def test_partition_and_merge_are_inverse_and_keep_only_tensors_for_dcp():
    sd = {"state": {"w": {"step": torch.tensor(3.0), "exp_avg": torch.ones(2), "flag": True}},
          "param_groups": [{"lr": 0.1, "betas": [0.9, 0.95], "params": ["w"]}], "empty": {}}
    tensors, rest = partition(sd)
    flat = [v for v in tensors["state"]["w"].values()]
    assert all(isinstance(v, torch.Tensor) for v in flat) and set(tensors) == {"state"}
    json.dumps(rest)  # everything else is JSON
    back = merge(tensors, json.loads(json.dumps(rest)))
    assert back["param_groups"] == sd["param_groups"] and back["empty"] == {}
    assert back["state"]["w"]["flag"] is True and torch.equal(back["state"]["w"]["exp_avg"], torch.ones(2))


def _model_and_opt(seed: int):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    return m, torch.optim.AdamW(m.parameters(), lr=1e-2)


def _step(m, opt, x=None):
    m(torch.randn(5, 4) if x is None else x).square().sum().backward()
    opt.step()
    opt.zero_grad()


def test_single_process_round_trip_is_bit_exact_including_rng(tmp_path):
    m, opt = _model_and_opt(0)
    for _ in range(3):
        _step(m, opt)
    random.seed(7)
    np.random.seed(7)
    path = save_checkpoint(tmp_path, 3, m, opt, ENV, {"identity": {}, "x": 1}, {"stream": {"epoch": 0, "index": 6}},
                           keep_last=2)
    assert ckpt_index.problem(path) is None
    expect = (torch.rand(3).tolist(), random.random(), float(np.random.rand()))
    x = torch.linspace(-1, 1, 20).reshape(5, 4)
    _step(m, opt, x)

    m2, opt2 = _model_and_opt(1)  # another init: everything must come from the checkpoint
    meta, mine = load_checkpoint(path, m2, opt2, ENV)
    assert meta["x"] == 1 and meta["step"] == 3 and mine["stream"] == {"epoch": 0, "index": 6}
    assert (torch.rand(3).tolist(), random.random(), float(np.random.rand())) == expect
    _step(m2, opt2, x)
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), m2.parameters()))


def test_metadata_that_would_run_code_is_refused(tmp_path):
    m, opt = _model_and_opt(0)
    _step(m, opt)
    path = save_checkpoint(tmp_path, 1, m, opt, ENV, {"identity": {}}, {"stream": {}}, keep_last=0)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').write('x')",))

    (path / "model" / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(BaseException) as err:  # DCP's CheckpointException is a BaseException
        load_checkpoint(path, *_model_and_opt(1), ENV)
    assert "refers to builtins.exec" in str(err.value)
    assert not marker.exists()


def test_a_save_replaces_a_zombie_of_the_same_step(tmp_path):
    zombie = _fake(tmp_path, 1)
    (zombie / "stale").write_text("from an earlier attempt")
    m, opt = _model_and_opt(0)
    _step(m, opt)
    path = save_checkpoint(tmp_path, 1, m, opt, ENV, {"identity": {}}, {"stream": {}}, keep_last=0)
    assert path == zombie and not (path / "stale").exists() and ckpt_index.problem(path) is None


@pytest.mark.parametrize("part", ["stream", "rng"])
def test_a_checkpoint_without_sampler_position_or_rng_is_refused_not_resumed_from_zero(tmp_path, part):
    from align.errors import ConfigError

    m, opt = _model_and_opt(0)
    _step(m, opt)
    path = save_checkpoint(tmp_path, 1, m, opt, ENV, {"identity": {}}, {"stream": {"epoch": 0, "index": 2}},
                           keep_last=0)
    rank0 = json.loads((path / "rank0.json").read_text())
    del rank0[part]
    (path / "rank0.json").write_text(json.dumps(rank0))
    with pytest.raises(ConfigError, match=f"trainer.resume: .*rank0.json lacks \\['{part}'\\]"):
        load_checkpoint(path, *_model_and_opt(1), ENV)


def test_the_next_prune_removes_what_an_interrupted_prune_left(tmp_path):
    for s in (2, 4, 6):
        _fake(tmp_path, s)
    half = _fake(tmp_path, 1, skip="meta.json")  # a deletion cut short, under the checkpoint's name
    left = _fake(tmp_path, 3)
    left.rename(tmp_path / "step_00000003.prune")  # cut short after the rename
    newer = _fake(tmp_path, 9, skip="model/.metadata")  # newer than this run's step: not ours to judge
    assert ckpt_index.to_prune(tmp_path, keep_last=2, upto_step=6) == [
        half, tmp_path / "step_00000002", tmp_path / "step_00000003.prune"]
    m, opt = _model_and_opt(0)
    _step(m, opt)
    save_checkpoint(tmp_path, 7, m, opt, ENV, {"identity": {}}, {"stream": {}}, keep_last=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000007", newer.name]


def test_a_prune_renames_before_it_deletes(tmp_path, monkeypatch):
    import shutil

    from align.control import checkpoint

    for s in (1, 2):
        _fake(tmp_path, s)
    real = shutil.rmtree

    def killed_mid_way(path, *a, **kw):  # the process dies after deleting one file
        if Path(path).name.startswith("step_00000001") and Path(path).exists():
            next(p for p in Path(path).rglob("*") if p.is_file()).unlink()
            raise KeyboardInterrupt
        return real(path, *a, **kw)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_mid_way)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.prune(tmp_path / "step_00000001")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001.prune", "step_00000002"]
