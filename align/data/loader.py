"""The stream of micro-batches the trainer consumes, resumable at the exact next micro-batch.

The sampler decides the rows; a DataLoader collates ahead in worker processes. Each item carries its
(epoch, index), and the trainer records the position of the last micro-batch it CONSUMED, so the
checkpointed position is right however far the loader prefetched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from align.data.collate import Batch, collate
from align.data.encode import EncodedDataset
from align.data.samplers import MicroBatchSampler


class _EpochBatches(Dataset):
    def __init__(self, data: EncodedDataset, batches: list[np.ndarray], pad_id: int, pad_to_multiple_of: int) -> None:
        self.data, self.batches, self.pad_id, self.mult = data, batches, pad_id, pad_to_multiple_of

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> Batch:
        return collate(self.data, self.batches[i], self.pad_id, self.mult)


def _identity(x: Any) -> Any:
    return x


@dataclass
class Position:
    epoch: int = 0
    index: int = 0  # next micro-batch of this rank within `epoch`


def loader_kwargs(num_workers: int, pin_memory: bool) -> dict[str, Any]:
    """DataLoader kwargs, built as data so preflight can check their names (playbook 4.2)."""
    kw: dict[str, Any] = {"batch_size": None, "shuffle": False, "collate_fn": _identity,
                          "num_workers": num_workers, "pin_memory": pin_memory}
    if num_workers > 0:
        kw.update(prefetch_factor=4, persistent_workers=False)
    return kw


class BatchStream:
    """Infinite micro-batch stream over epochs; `position` is the next micro-batch to consume."""

    def __init__(self, data: EncodedDataset, sampler: MicroBatchSampler, pad_id: int, pad_to_multiple_of: int = 1,
                 num_workers: int = 0, pin_memory: bool = False) -> None:
        self.data, self.sampler = data, sampler
        self.pad_id, self.mult = pad_id, pad_to_multiple_of
        self.kwargs = loader_kwargs(num_workers, pin_memory)
        self.position = Position()

    def __iter__(self) -> Iterator[Batch]:
        while True:
            epoch, start = self.position.epoch, self.position.index
            batches = self.sampler.rank_batches(epoch)[start:]
            loader = DataLoader(_EpochBatches(self.data, batches, self.pad_id, self.mult), **self.kwargs)
            for i, batch in enumerate(loader):
                self.position = Position(epoch, start + i + 1)
                yield batch
            self.position = Position(epoch + 1, 0)

    def state_dict(self) -> dict:
        return {"epoch": self.position.epoch, "index": self.position.index, **{
            k: v for k, v in self.sampler.state_dict().items() if k not in ("epoch", "index")}}

    def load_state_dict(self, state: dict) -> None:
        self.position = Position(int(state["epoch"]), int(state["index"]))
