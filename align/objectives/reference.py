"""The reference a preference (or KL-regularised) loss is measured against, three ways
(`objective.reference`):

- `model`: a frozen copy of the starting policy (optionally in a smaller dtype), placed and sharded
  like the policy;
- `adapters_off`: with LoRA, the policy itself with its adapters disabled: the base, no second copy;
- `precomputed`: the starting policy's log-probs of every pair, computed once before the first update
  and cached on disk under a key of what they MEAN (`cache_key`): a changed weight, mask, template,
  precision or version is a different entry, a legitimate resume the same one.

Every strategy has an identity for the manifest and the checkpoint: the content hash of the
reference's weights, read from the unsharded model before any update.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from align.config import ReferenceDtype, ReferenceKind, TrainConfig
from align.errors import ConfigError

REFERENCE_CACHE_VERSION = 1
"""Bump when what a cached entry holds changes meaning (how log-probs are summed, masked, ordered)."""


def weights_sha256(model: torch.nn.Module, skip: Callable[[str], bool] = lambda name: False) -> str:
    """sha256 over the names, dtypes, shapes and bytes of every parameter and buffer (sorted by name)
    of an unsharded model, `skip`ped names left out (LoRA adapters, for the base's identity)."""
    h = hashlib.sha256()
    tensors = dict(model.named_parameters())
    tensors.update(dict(model.named_buffers()))
    for name in sorted(tensors):
        if skip(name):
            continue
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def model_config_meaning(model: torch.nn.Module) -> str:
    """sha256 of the model config's fields that change what the weights compute (rope, norms, windows,
    softcaps...): the weights' hash does not cover them. Private fields (`_attn_implementation`,
    `_name_or_path`) and the library version are left out: they name how or where, not what."""
    fields = {k: v for k, v in model.config.to_dict().items() if not k.startswith("_") and k != "transformers_version"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def is_adapter(name: str) -> bool:
    return "lora_" in name


def cache_key(parts: dict[str, Any]) -> str:
    """The precomputed reference's key: sha256 of the canonical JSON of what the log-probs mean."""
    blob = json.dumps({"version": REFERENCE_CACHE_VERSION, **parts}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class FrozenCopy:
    """`reference=model`: a separate module that never trains."""

    kind = "model"

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        module.requires_grad_(False)
        module.eval()

    def sequence_logps(self, forward: Callable, logps_of: Callable, batch: Any) -> torch.Tensor:
        with torch.no_grad():
            return logps_of(forward, batch, module=self.module)


class AdaptersOff:
    """`reference=adapters_off`: the LoRA policy with its adapters disabled (peft's `disable_adapter`)."""

    kind = "adapters_off"

    def __init__(self, policy: torch.nn.Module) -> None:
        if not hasattr(policy, "disable_adapter"):
            raise TypeError(f"{type(policy).__name__} has no disable_adapter(): not a peft model")
        self.policy = policy

    def sequence_logps(self, forward: Callable, logps_of: Callable, batch: Any) -> torch.Tensor:
        with torch.no_grad(), self.policy.disable_adapter():
            return logps_of(forward, batch)


class Precomputed:
    """`reference=precomputed`: a [pairs, 2] table (chosen, rejected) of summed log-probs."""

    kind = "precomputed"

    def __init__(self, table: torch.Tensor, key: str, hit: bool, path: Optional[Path]) -> None:
        self.table, self.key, self.hit, self.path = table, key, hit, path

    def pair_logps(self, pair_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.table.index_select(0, pair_ids.to(self.table.device))
        return rows[:, 0], rows[:, 1]


def load_table(path: Path, pairs: int) -> Optional[torch.Tensor]:
    """A cached table, or None when absent or not of this data set's size (a torn write is never
    read: entries are renamed into place complete)."""
    if not path.is_file():
        return None
    table = torch.from_numpy(np.load(path))
    return table if table.shape == (pairs, 2) else None


def save_table(path: Path, table: torch.Tensor) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{id(table)}.npy")
    np.save(tmp, table.detach().cpu().numpy())
    tmp.replace(path)


def preference_reference(cfg: TrainConfig, epochs: Optional[float] = None) -> Optional[ReferenceKind]:
    """DPO's reference: none for a reference-free loss; auto: the LoRA base, else precomputed where the
    run reads every pair at least once (`epochs`, once the pair stream is planned), else a frozen copy
    (also before the stream is planned: the memory estimate then counts the copy)."""
    return preference_reference_why(cfg, epochs)[0]


def preference_reference_why(cfg: TrainConfig, epochs: Optional[float] = None) -> tuple[Optional[ReferenceKind], str]:
    """`preference_reference` and why. Precomputed log-probs cost one reference forward per pair of the
    file, up front (none on a cache hit); a frozen copy costs one per pair trained, and a second copy
    of the weights. So from one epoch on, precomputed does less work, holds less memory and gives the
    same reference: the starting policy's log-probs (measured: docs/performance.md, section "DPO")."""
    o = cfg.objective
    if o.reference_free():
        return None, f"loss={o.loss} is reference-free"
    if o.reference != ReferenceKind.auto:
        if o.reference == ReferenceKind.adapters_off and not cfg.model.lora.enabled:
            raise ConfigError("objective.reference", "adapters_off needs model.lora.enabled=true", "adapters_off")
        return o.reference, "as given"
    if cfg.model.lora.enabled:
        return ReferenceKind.adapters_off, "auto: LoRA: the base with the adapters off needs no copy"
    if epochs is None:
        return ReferenceKind.model, "auto: the pair stream is not planned yet: a frozen copy, the upper bound"
    if epochs >= 1:
        return ReferenceKind.precomputed, (f"auto: the run reads {epochs:.2f} epochs of the pairs: one reference "
                                           "forward per pair up front costs less than one per pair trained")
    return ReferenceKind.model, (f"auto: the run reads {epochs:.2f} of an epoch: a frozen copy's forward per pair "
                                 "trained costs less than precomputing every pair")


def kl_reference(cfg: TrainConfig) -> Optional[ReferenceKind]:
    """GRPO's reference for the KL term: none when kl_coef is 0; auto: the LoRA base, else a copy."""
    o = cfg.objective
    if o.kl_coef == 0:
        return None
    if o.reference == ReferenceKind.auto:
        return ReferenceKind.adapters_off if cfg.model.lora.enabled else ReferenceKind.model
    if o.reference == ReferenceKind.adapters_off and not cfg.model.lora.enabled:
        raise ConfigError("objective.reference", "adapters_off needs model.lora.enabled=true", "adapters_off")
    return o.reference


_DTYPES = {ReferenceDtype.bf16: torch.bfloat16, ReferenceDtype.fp32: torch.float32}


def prepare_reference(model: torch.nn.Module, kind: Optional[ReferenceKind], dtype: ReferenceDtype
                      ) -> tuple[Optional[str], Optional[FrozenCopy]]:
    """Before placement, from the unsharded starting weights: the reference's identity (its weights'
    sha256; the base's alone for adapters_off) and, for reference=model, the frozen copy, which the
    trainer places and shards like the policy. (None, None) without a reference."""
    if kind is None:
        return None, None
    sha = weights_sha256(model, skip=is_adapter if kind == ReferenceKind.adapters_off else (lambda n: False))
    if kind != ReferenceKind.model:
        return sha, None
    ref = copy.deepcopy(model)
    if dtype in _DTYPES:
        ref.to(_DTYPES[dtype])
    return sha, FrozenCopy(ref)
