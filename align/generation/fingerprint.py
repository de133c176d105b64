"""A fingerprint of a set of weights computed where they live: per tensor, a checksum of its bytes on
its own device, and on the host a sha256 over the names, shapes, dtypes and checksums.

The rollout check compares the generation copy with the training weights before every rollout;
hashing every byte on the host meant copying the whole model to the CPU twice per rollout, which on
a GPU took longer than the update it guarded (docs/grpo.md#rollouts-that-cannot-lie). The checksum reads each
tensor as 16-bit words w_i (bytes for 1-byte dtypes) and sums (w_i * c_i) mod P with P = 2^31 - 1 and
position coefficients c_i in [1, P - 1]: a change of one word (|delta| < 2^16 < P) always changes
it, and several changes cancel with probability about 1 / P per tensor."""

from __future__ import annotations

import hashlib
from typing import Iterable, Optional

import torch

_P = 2**31 - 1
_CHUNK = 1 << 24
"""Words per reduction: bounds the int64 temporaries (and keeps every partial sum below 2^63)."""


def _words(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().contiguous().view(-1)
    if flat.element_size() == 1:
        return flat.view(torch.uint8)
    return flat.view(torch.uint8).view(torch.int16)


def checksum(t: torch.Tensor) -> torch.Tensor:
    """sum_i (w_i * c_i) mod P over the tensor's words, as a 0-dim int64 tensor on its device."""
    words = _words(t)
    total = torch.zeros((), dtype=torch.int64, device=t.device)
    for start in range(0, words.numel(), _CHUNK):
        w = words[start:start + _CHUNK].to(torch.int64)
        idx = torch.arange(start, start + w.numel(), dtype=torch.int64, device=t.device)
        coef = torch.remainder(idx * 2654435761 + 97, _P - 1) + 1
        total = torch.remainder(total + torch.remainder(w * coef, _P).sum(), _P)
    return total


def fingerprint(named: Iterable[tuple[str, torch.Tensor]], dtype: Optional[torch.dtype] = None) -> str:
    """sha256 hex digest over (name, shape, dtype, checksum) of every tensor, floating ones cast to
    `dtype` first; one device-to-host read for the whole set."""
    heads, sums = [], []
    for name, t in named:
        if dtype is not None and t.is_floating_point():
            t = t.detach().to(dtype)
        heads.append(f"{name}:{tuple(t.shape)}:{t.dtype}")
        sums.append(checksum(t))
    values = torch.stack([s.to(sums[0].device) for s in sums]).tolist() if sums else []
    h = hashlib.sha256()
    for head, v in zip(heads, values):
        h.update(f"{head}={v};".encode())
    return h.hexdigest()
