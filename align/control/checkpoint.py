"""Resumable checkpoints with torch.distributed.checkpoint (DCP): sharded, written by every rank.

    checkpoints/step_00000010/
      model/   DCP: model tensors (FSDP/EP shards as DTensors; one writer file per rank)
      optim/   DCP: optimizer tensors (per-rank shards; separate from model/ so each can be checked)
      rank<r>.json   this rank's sampler/BatchStream position and RNG states (torch CPU/CUDA, python, numpy)
      meta.json      step counters, skip statistics, scheduler state, the optimizer's non-tensor state,
                     and what the run was (world size, dataset fingerprint, sampler, model shape)

Everything is written into `step_N.tmp/`; after every rank has finished (barrier) rank 0 writes
meta.json, fsyncs and renames the directory: a `step_N/` is complete by construction and
`ckpt_index.problem()` double-checks the parts (docs/pitfalls.md#14).

Nothing in a checkpoint can run code when read: only tensors go through DCP (so its pickle path for
non-tensor "bytes" items is never taken); the non-tensor leaves go to JSON; DCP's `.metadata` is read
with an unpickler that accepts only DCP's own metadata classes and torch dtypes/sizes.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pickle
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from align.control.ckpt_index import PRUNING, checkpoint_name, problem, stale_tmp, to_prune
from align.errors import ConfigError
from align.parallel.env import DistEnv

_ABSENT = object()


# ------------------------------------------------------------------------ tensors vs the rest


def partition(obj: Any) -> tuple[Any, Any]:
    """Split a nested state dict into (tensors only, everything else) with the same nesting."""
    if isinstance(obj, torch.Tensor):
        return obj, _ABSENT
    if isinstance(obj, dict):
        tensors, rest = {}, {}
        for k, v in obj.items():
            t, r = partition(v)
            if t is not _ABSENT:
                tensors[k] = t
            if r is not _ABSENT:
                rest[k] = r
        if not tensors and not rest:
            return _ABSENT, {}
        return (tensors if tensors else _ABSENT), (rest if rest else _ABSENT)
    if isinstance(obj, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in obj):
        raise TypeError("a list of tensors in a state dict is not supported by align's checkpoint split")
    return _ABSENT, obj


def merge(tensors: Any, rest: Any) -> Any:
    """Inverse of `partition`."""
    if rest is _ABSENT:
        return tensors
    if tensors is _ABSENT:
        return rest
    out = dict(tensors)
    for k, v in rest.items():
        out[k] = merge(tensors.get(k, _ABSENT), v)
    return out


def _json_rest(rest: Any) -> Any:
    return None if rest is _ABSENT else rest


# ---------------------------------------------------------------------- safe metadata reading


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's `.metadata` is a pickle; accept only the classes a DCP metadata file is made of."""

    SAFE = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
            ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath")}

    def find_class(self, module: str, name: str) -> Any:
        ok = (module, name) in self.SAFE or module.startswith("torch.distributed.checkpoint.") or (
            module == "torch"
            and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)))
        if not ok:
            raise pickle.UnpicklingError(
                f"checkpoint metadata refers to {module}.{name}, which a DCP metadata file never holds")
        return super().find_class(module, name)


class SafeReader(FileSystemReader):
    """FileSystemReader whose metadata read cannot instantiate arbitrary classes (the rest of
    `read_metadata` is the library's own, torch 2.13)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


# --------------------------------------------------------------------------------- RNG states


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode()


def _unb64(s: str) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(base64.b64decode(s), dtype=np.uint8).copy())


def rng_state(device: torch.device) -> dict[str, Any]:
    np_state = np.random.get_state()
    state = {
        "torch_cpu": _b64(torch.get_rng_state()),
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    if device.type == "cuda":
        state["torch_cuda"] = _b64(torch.cuda.get_rng_state(device))
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(_unb64(state["torch_cpu"]))
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if device.type == "cuda" and "torch_cuda" in state:
        torch.cuda.set_rng_state(_unb64(state["torch_cuda"]), device)


# ------------------------------------------------------------------------------- save / load


@contextlib.contextmanager
def _quiet_if(solo: bool):
    """DCP warns on every single-process save/load that it is single-process; that is the intent."""
    with warnings.catch_warnings():
        if solo:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _encode(obj: Any) -> Any:
    """Small tensors among the non-tensor state (torchao keeps `lr` as a 0-d tensor, and so does the
    scheduler's `_last_lr` then) go to JSON as values with their dtype, and come back as tensors."""
    if isinstance(obj, torch.Tensor) and obj.numel() <= 64:
        return {"__tensor__": obj.detach().cpu().tolist(), "dtype": str(obj.dtype).removeprefix("torch.")}
    raise TypeError(f"not JSON-serialisable checkpoint state: {type(obj).__name__}")


def _decode(d: dict) -> Any:
    if set(d) == {"__tensor__", "dtype"}:
        return torch.tensor(d["__tensor__"], dtype=getattr(torch, d["dtype"]))
    return d


def _read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text(), object_hook=_decode)


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, default=_encode)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(root: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, env: DistEnv,
                    meta: dict[str, Any], rank_state: dict[str, Any], keep_last: int) -> Path:
    """Collective: every rank calls it. Returns the final (complete) directory."""
    root = Path(root)
    final = root / checkpoint_name(step)
    tmp = root / (final.name + ".tmp")
    if env.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "model").mkdir(parents=True)
        (tmp / "optim").mkdir()
    env.barrier()

    model_sd, optim_sd = get_state_dict(model, optimizer)
    model_t, model_rest = partition(model_sd)
    optim_t, optim_rest = partition(optim_sd)
    solo = not env.distributed
    with _quiet_if(solo):
        dcp.save(model_t, checkpoint_id=tmp / "model", no_dist=solo)
        dcp.save(optim_t, checkpoint_id=tmp / "optim", no_dist=solo)
    _write_json(tmp / f"rank{env.rank}.json", {"rank": env.rank, **rank_state, "rng": rng_state(env.device)})
    env.barrier()

    if env.is_main:
        _write_json(tmp / "meta.json", {**meta, "step": step, "world_size": env.world,
                                        "model_rest": _json_rest(model_rest), "optim_rest": _json_rest(optim_rest)})
        _fsync_dir(tmp)
        if final.exists():  # a zombie of an earlier attempt that got this far: replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        for old in to_prune(root, keep_last, step):
            prune(old)
    env.barrier()
    return final


def prune(path: Path) -> None:
    """Rename, then delete: a deletion cut short leaves a `.prune` dir (deleted by the next prune), never
    a half-deleted directory under a checkpoint's name."""
    doomed = path if path.name.endswith(PRUNING) else path.with_name(path.name + PRUNING)
    if doomed != path:
        shutil.rmtree(doomed, ignore_errors=True)
        os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)  # what stays is retried by the next prune


def read_meta(path: Path) -> dict[str, Any]:
    why = problem(path)
    if why:
        raise FileNotFoundError(why)
    return _read_json(Path(path) / "meta.json")


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    env: DistEnv) -> tuple[dict, dict]:
    """Collective. Loads model and optimizer (resharding through DCP) and this rank's RNG states;
    returns (meta, this rank's state) for the caller to restore counters, scheduler and sampler.
    Raises on EVERY rank when any rank cannot read its part (DCP itself raises on all ranks), so the
    ranks leave together and can try another checkpoint together."""
    path = Path(path)
    err: Exception | None = None
    try:
        meta = read_meta(path)
        rank_state = _read_json(path / f"rank{env.rank}.json")
        missing = [k for k in ("stream", "rng") if k not in rank_state]
        if missing:  # a resume without its data position or RNG is the silent-wrong-result bug: refuse
            raise ConfigError("trainer.resume", f"{path}/rank{env.rank}.json lacks {missing} (sampler position, RNG); "
                                                "this checkpoint cannot be resumed exactly")
        for part in ("model", "optim"):
            check_dcp_files(path / part)
    except Exception as e:  # whatever reading this checkpoint's small files raises; DCP's read is next
        err = e
    _together(env, err, f"reading {path}")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    model_t, _ = partition(model_sd)
    optim_t, _ = partition(optim_sd)
    solo = not env.distributed
    with _quiet_if(solo):
        dcp.load(model_t, storage_reader=SafeReader(path / "model"), no_dist=solo)
        dcp.load(optim_t, storage_reader=SafeReader(path / "optim"), no_dist=solo)
    try:
        model_sd = merge(model_t, _absent_if_none(meta.get("model_rest")))
        optim_sd = merge(optim_t, _absent_if_none(meta.get("optim_rest")))
        set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
        set_rng_state(rank_state["rng"], env.device)
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        err = e
    _together(env, err, f"restoring from {path}")
    return meta, rank_state


def check_dcp_files(d: Path) -> None:
    """Read a DCP directory's `.metadata` and check that every data file it indexes is there and long
    enough: a truncated or lost file fails here with its name, before DCP reads anything."""
    try:
        index = SafeReader(d).read_metadata().storage_data
    except Exception as e:  # a truncated pickle raises EOFError or UnpicklingError, a crafted one ours
        raise ValueError(f"{d.name}/.metadata is unreadable ({type(e).__name__}: {e})") from e
    need: dict[str, int] = {}
    for info in index.values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for rel, size in sorted(need.items()):
        f = d / rel
        have = f.stat().st_size if f.is_file() else None
        if have is None or have < size:
            raise ValueError(f"{d.name}/{rel} is {'missing' if have is None else f'{have} bytes'}; "
                             f"its .metadata indexes {size} bytes")


def _together(env: DistEnv, err: Exception | None, what: str) -> None:
    """Raise on every rank when `what` failed on any: a rank that went on alone would wait forever in
    the next collective while the others tried something else."""
    failed = int(err is not None)
    if env.distributed:
        flag = torch.tensor([float(failed)], device=env.device)
        env.all_reduce_sum(flag)
        failed = int(flag.item())
    if err is not None:
        raise err
    if failed:
        raise RuntimeError(f"{what} failed on {failed} other rank(s)")


def _absent_if_none(v: Any) -> Any:
    return _ABSENT if v is None else v


def remove_stale_tmp(root: Path) -> list[Path]:
    """Unfinished `step_N.tmp/` dirs of a previous attempt (never counted; only taking space)."""
    gone = stale_tmp(root)
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone
