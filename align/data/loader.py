"""The stream of micro-batches the trainer consumes, resumable at the exact next micro-batch.

The sampler decides the rows; a DataLoader collates ahead (in worker processes when asked). The
stream's `position` is advanced only when a micro-batch is handed to the consumer, so a checkpoint
taken between steps holds the next micro-batch to CONSUME however far the loader prefetched.

`state_dict()` also carries the data set's fingerprint, the sampler's fingerprint and the world
size; `load_state_dict()` refuses a state saved under different ones (docs/pitfalls.md#15): the same
position in a different order is the silent-wrong-result resume.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from align.data.collate import Batch, collate
from align.data.encode import EncodedDataset, dataset_fingerprint
from align.data.loader_kwargs import NUM_WORKERS, loader_kwargs
from align.data.samplers import MicroBatchSampler, build_sampler
from align.data.stats import DataStats, plan_stats, root_codes
from align.errors import ConfigError

log = logging.getLogger("align")


Collate = Callable[..., Batch]
"""`collate(data, rows, pad_id, pad_to_multiple_of, packed, mask_padding) -> Batch` (align.data.collate.collate
or align.data.pairs.collate_pairs); a module-level function, so loader workers can pickle it."""


class _EpochBatches(Dataset):
    def __init__(self, data: EncodedDataset, batches: list[np.ndarray], pad_id: int, pad_to_multiple_of: int,
                 packed: bool, mask_padding: bool = True, collate_fn: Collate = collate) -> None:
        self.data, self.batches, self.pad_id, self.mult, self.packed = data, batches, pad_id, pad_to_multiple_of, packed
        self.mask_padding, self.collate_fn = mask_padding, collate_fn

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> Batch:
        return self.collate_fn(self.data, self.batches[i], self.pad_id, self.mult, self.packed, self.mask_padding)


@dataclass
class Position:
    epoch: int = 0
    index: int = 0  # next micro-batch of this rank within `epoch`


class BatchStream:
    """Infinite micro-batch stream over epochs; `position` is the next micro-batch to consume."""

    def __init__(self, data: EncodedDataset, sampler: MicroBatchSampler, pad_id: int, pad_to_multiple_of: int = 1,
                 num_workers: int = NUM_WORKERS, pin_memory: bool = False, packed: Optional[bool] = None,
                 stats: Optional[DataStats] = None, mask_padding: bool = True, collate_fn: Collate = collate) -> None:
        self.data, self.sampler = data, sampler
        self.mask_padding, self.collate_fn = mask_padding, collate_fn
        self.pad_id, self.mult = pad_id, pad_to_multiple_of
        self.packed = sampler.packed if packed is None else packed
        self.kwargs = loader_kwargs(num_workers, pin_memory)
        self.position = Position()
        self.stats = stats

    def __iter__(self) -> Iterator[Batch]:
        while True:
            epoch, start = self.position.epoch, self.position.index
            batches = self.sampler.rank_batches(epoch)[start:]
            epoch_batches = _EpochBatches(self.data, batches, self.pad_id, self.mult, self.packed, self.mask_padding,
                                          self.collate_fn)
            # A DataLoader iterator draws its base seed from the global torch RNG unless given a
            # generator: a resumed run would draw it after restoring that RNG, and every dropout mask
            # after it would differ from the uninterrupted run's.
            seed = int(np.random.default_rng([self.sampler.seed, epoch]).integers(2**62))
            generator = torch.Generator().manual_seed(seed)
            loader = DataLoader(epoch_batches, **{**self.kwargs, "generator": generator})
            for i, batch in enumerate(loader):
                self.position = Position(epoch, start + i + 1)
                yield batch
            self.position = Position(epoch + 1, 0)

    def peek(self) -> Batch:
        """The micro-batch the stream yields next, collated on its own; the position does not move
        (run-start gates look at what step 1 will train on)."""
        epoch, index = self.position.epoch, self.position.index
        batches = self.sampler.rank_batches(epoch)
        if index >= len(batches):
            epoch, index, batches = epoch + 1, 0, self.sampler.rank_batches(epoch + 1)
        return self.collate_fn(self.data, batches[index], self.pad_id, self.mult, self.packed, self.mask_padding)

    def state_dict(self) -> dict:
        return {"epoch": self.position.epoch, "index": self.position.index, "seed": self.sampler.seed,
                "world": self.sampler.world, "rank": self.sampler.rank, "sampler": self.sampler.fingerprint(),
                "dataset": dataset_fingerprint(self.data)}

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Continue at the saved position. `strict=False` (trainer.resume_despite_mismatch) loads it
        even under another world size, data set or sampler, with a warning: the position then
        indexes a different order, and the run says so."""
        mine = self.state_dict()
        for k, what in (("world", "world size"), ("dataset", "data set fingerprint"), ("sampler", "sampler settings")):
            if k in state and state[k] != mine[k]:
                msg = (f"the checkpoint's data position was saved under another {what} ({state[k]!r} != {mine[k]!r}); "
                       "it would not resume at the next micro-batch")
                if strict:
                    raise ConfigError("resume", msg)
                log.warning("resume despite mismatch: %s", msg)
        self.position = Position(int(state["epoch"]), int(state["index"]))


def build_stream(cfg, data: EncodedDataset, pad_id: int, rank: int = 0, world: int = 1,
                 pin_memory: bool = False) -> BatchStream:
    """The trainer's one call: sampler (with mixture weights), stream and its stats, from a TrainConfig."""
    from align.data.sources import source_specs

    weights = [s.weight for s in source_specs(cfg.data)]
    sampler = build_sampler(cfg.sampler, data.lengths, cfg.trainer.seed, rank, world,
                            mixture=(data.source_index, weights))
    plan = plan_stats(sampler, root_codes(data.roots), cfg.trainer.grad_accum * world)
    sampler.plan = plan
    stats = DataStats(data, plan)
    return BatchStream(data, sampler, pad_id, cfg.sampler.pad_to_multiple_of, packed=cfg.sampler.packed,
                       pin_memory=pin_memory, stats=stats, mask_padding=cfg.sampler.mask_padding)
