"""Micro-batch samplers: which rows form each micro-batch, deterministic from (seed, epoch).

Each sampler builds the GLOBAL list of micro-batches for an epoch, then rank r takes every world-th
one (after trimming to a multiple of world): ranks draw disjoint rows and the same number of
micro-batches. Iteration is resumable to the exact next micro-batch via state_dict().
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from align.config import SamplerConfig, SamplerKind


class MicroBatchSampler:
    def __init__(self, lengths: np.ndarray, micro_batch_size: int, seed: int, rank: int = 0, world: int = 1) -> None:
        self.lengths = np.asarray(lengths)
        self.micro_batch_size = micro_batch_size
        self.seed = seed
        self.rank = rank
        self.world = world
        self.epoch = 0
        self.index = 0  # next micro-batch of this rank within the epoch

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, epoch])

    def global_batches(self, epoch: int) -> list[np.ndarray]:
        raise NotImplementedError

    def rank_batches(self, epoch: int) -> list[np.ndarray]:
        g = self.global_batches(epoch)
        usable = len(g) // self.world * self.world
        if usable == 0:
            raise ValueError(f"{len(g)} micro-batches cannot be split over {self.world} ranks")
        return g[self.rank : usable : self.world]

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            batches = self.rank_batches(self.epoch)
            while self.index < len(batches):
                rows = batches[self.index]
                self.index += 1
                yield rows
            self.epoch += 1
            self.index = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed, "world": self.world}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        self.index = int(state["index"])


class ShuffleSampler(MicroBatchSampler):
    """A random permutation cut into micro-batches: the baseline for padding and diversity."""

    def global_batches(self, epoch: int) -> list[np.ndarray]:
        perm = self._rng(epoch).permutation(len(self.lengths))
        m = self.micro_batch_size
        return [perm[i : i + m] for i in range(0, len(perm), m)]


class BucketSampler(MicroBatchSampler):
    """Bucket to pair, shuffle to mix (playbook 3.2).

    A random permutation is cut into buckets of `bucket_size` records; each bucket is sorted by
    length and cut into micro-batches of neighbours (tight pairing, little padding); then all
    micro-batches are shuffled globally, which restores source diversity per accumulation window.
    """

    def __init__(self, lengths, micro_batch_size, seed, bucket_size: int, rank: int = 0, world: int = 1) -> None:
        super().__init__(lengths, micro_batch_size, seed, rank, world)
        self.bucket_size = bucket_size

    def global_batches(self, epoch: int) -> list[np.ndarray]:
        rng = self._rng(epoch)
        perm = rng.permutation(len(self.lengths))
        m = self.micro_batch_size
        batches: list[np.ndarray] = []
        for b in range(0, len(perm), self.bucket_size):
            bucket = perm[b : b + self.bucket_size]
            bucket = bucket[np.argsort(self.lengths[bucket], kind="stable")]
            batches.extend(bucket[i : i + m] for i in range(0, len(bucket), m))
        order = rng.permutation(len(batches))
        return [batches[i] for i in order]


def build_sampler(cfg: SamplerConfig, lengths: np.ndarray, seed: int, rank: int = 0, world: int = 1) -> MicroBatchSampler:
    if cfg.kind == SamplerKind.bucket:
        return BucketSampler(lengths, cfg.micro_batch_size, seed, cfg.bucket_size, rank, world)
    return ShuffleSampler(lengths, cfg.micro_batch_size, seed, rank, world)
