"""Micro-batch samplers: which rows form each micro-batch, deterministic from (seed, epoch).

Each sampler builds the GLOBAL list of micro-batches of an epoch from one generator seeded with
(seed, epoch), then rank r takes every world-th one after trimming the list to a multiple of world:
ranks draw disjoint rows and the same number of micro-batches. A sampler holds no position: the
position (epoch, index) lives in the BatchStream, which checkpoints it (align.data.loader).

- shuffle: a random permutation cut into micro-batches (the baseline for padding and diversity).
- bucket: bucket to PAIR, shuffle to MIX (docs/triage.md#4): sort within buckets of `bucket_size`
  records, cut micro-batches of neighbours, then shuffle the micro-batches globally.
- budget: as bucket, but each micro-batch takes as many rows as fit `max_tokens`.

With a mixture, the epoch's pool holds each source `weight` times (the fractional part a fresh
random subset each epoch): a record can then appear twice in an epoch, and "disjoint" is per draw.
"""

from __future__ import annotations

import hashlib
import json
from typing import Iterator, Optional, Sequence

import numpy as np

from align.config import SamplerConfig, SamplerKind
from align.config.data import require_resolved
from align.errors import ConfigError


def padded_len(n: np.ndarray | int, multiple: int) -> np.ndarray | int:
    return -(-n // multiple) * multiple


def batch_shapes(batches: Sequence[np.ndarray], lengths: np.ndarray, pad_to_multiple_of: int = 1,
                 packed: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(tokens computed, real tokens) of each micro-batch, as collate would build it."""
    if not len(batches):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    sizes = np.fromiter((len(b) for b in batches), dtype=np.int64, count=len(batches))
    lens = np.asarray(lengths, dtype=np.int64)[np.concatenate(list(batches))]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    real = np.add.reduceat(lens, starts)
    if packed:
        return padded_len(real, pad_to_multiple_of), real
    return sizes * padded_len(np.maximum.reduceat(lens, starts), pad_to_multiple_of), real


def padding_stats(batches: Sequence[np.ndarray], lengths: np.ndarray, pad_to_multiple_of: int = 1,
                  packed: bool = False) -> dict[str, float]:
    """Padding waste (padded tokens / all tokens), the fraction of micro-batches with no padding
    (those run without a mask, on SDPA's is_causal path), the largest micro-batch in tokens."""
    computed, real = batch_shapes(batches, lengths, pad_to_multiple_of, packed)
    total = int(computed.sum())
    return {
        "micro_batches": len(batches),
        "pad_waste": 1.0 - real.sum() / total if total else 0.0,
        "zero_pad_frac": float((computed == real).mean()) if len(batches) else 0.0,
        "max_batch_tokens": int(computed.max()) if len(batches) else 0,
        "mean_rows": float(np.mean([len(b) for b in batches])) if len(batches) else 0.0,
    }



class MicroBatchSampler:
    kind = "base"
    size_key = "sampler.micro_batch_size"
    """The config key that sets how many rows a micro-batch takes: what an error about the micro-batch
    count names."""

    def __init__(self, lengths: np.ndarray, micro_batch_size: int, seed: int, rank: int = 0, world: int = 1, *,
                 pad_to_multiple_of: int = 1, packed: bool = False,
                 mixture: Optional[tuple[np.ndarray, Sequence[float]]] = None) -> None:
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.micro_batch_size = micro_batch_size
        self.seed = seed
        self.rank = rank
        self.world = world
        self.pad_to_multiple_of = pad_to_multiple_of
        self.packed = packed
        self.mixture = None
        if mixture is not None and any(w != 1.0 for w in mixture[1]):
            src, weights = mixture
            self.mixture = ([np.flatnonzero(np.asarray(src) == i) for i in range(len(weights))],
                            [float(w) for w in weights])
        # Kept for callers of the pre-BatchStream iteration API.
        self.epoch = 0
        self.index = 0

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, epoch])

    def epoch_pool(self, rng: np.random.Generator) -> np.ndarray:
        """The rows of one epoch in random order (each source `weight` times under a mixture)."""
        if self.mixture is None:
            return rng.permutation(len(self.lengths))
        parts = []
        for rows, w in zip(*self.mixture):
            whole, frac = int(w), w - int(w)
            parts.extend([rows] * whole)
            if frac > 0:
                parts.append(rng.choice(rows, size=int(round(frac * len(rows))), replace=False))
        pool = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return pool[rng.permutation(len(pool))]

    def global_batches(self, epoch: int) -> list[np.ndarray]:
        raise NotImplementedError

    def rank_batches(self, epoch: int) -> list[np.ndarray]:
        g = self.global_batches(epoch)
        usable = len(g) // self.world * self.world
        if usable == 0:
            raise ConfigError(self.size_key, f"{len(g)} micro-batches per epoch cannot be split over {self.world} "
                              f"ranks: a smaller {self.size_key} cuts the data into more of them (or use more data or "
                              "fewer ranks)")
        return g[self.rank : usable : self.world]

    def fingerprint(self) -> str:
        """What decides the batches besides the data: a resume with a different one would not land
        on the next micro-batch of the same order."""
        state = {"kind": self.kind, "mbs": self.micro_batch_size, "seed": self.seed, "world": self.world,
                 "mult": self.pad_to_multiple_of, "packed": self.packed, **self._extra(),
                 "mixture": None if self.mixture is None else self.mixture[1]}
        return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()

    def _extra(self) -> dict:
        return {}

    def shuffle_baseline(self, rows: int) -> "MicroBatchSampler":
        """A pure shuffle of the same pool with `rows` rows per micro-batch: what roots per window
        are compared with (align.data.stats.plan_stats)."""
        shuffle = ShuffleSampler(self.lengths, rows, self.seed, mixture=None)
        shuffle.mixture = self.mixture
        return shuffle

    plan: Optional[dict] = None
    """Epoch-0 plan stats with roots per window, set by `build_stream` (align.data.stats.plan_stats)."""

    def stats(self) -> dict:
        """What this sampler does over epoch 0 (the manifest's sampler.stats): padding waste, zero-pad
        micro-batches, largest micro-batch, and roots per window beside a pure shuffle when known."""
        if self.plan is None:
            self.plan = padding_stats(self.global_batches(0), self.lengths, self.pad_to_multiple_of, self.packed)
        mine = padding_stats(self.rank_batches(0), self.lengths, self.pad_to_multiple_of, self.packed)
        # This rank's share of epoch 0 under the manifest's names, then the global plan.
        return {"kind": self.kind, "micro_batches_per_epoch": mine["micro_batches"],
                "padding_waste_epoch0": mine["pad_waste"], "zero_pad_fraction_epoch0": mine["zero_pad_frac"],
                "global": dict(self.plan)}

    # Pre-BatchStream iteration API (the stream is what the trainer checkpoints).
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


def _cut(rows: np.ndarray, size: int) -> list[np.ndarray]:
    return np.split(rows, np.arange(size, len(rows), size)) if len(rows) else []


class ShuffleSampler(MicroBatchSampler):
    """A random permutation cut into micro-batches: the baseline for padding and diversity."""

    kind = "shuffle"

    def global_batches(self, epoch: int) -> list[np.ndarray]:
        return _cut(self.epoch_pool(self._rng(epoch)), self.micro_batch_size)


class BucketSampler(MicroBatchSampler):
    """Bucket to pair, shuffle to mix (docs/triage.md#4).

    The epoch's random order is cut into buckets of `bucket_size` records; each bucket is sorted by
    length and cut into micro-batches of neighbours (tight pairing, little padding); then all
    micro-batches are shuffled globally, which restores source diversity per accumulation window.
    """

    kind = "bucket"

    def __init__(self, lengths, micro_batch_size, seed, bucket_size: int, rank: int = 0, world: int = 1, **kw) -> None:
        super().__init__(lengths, micro_batch_size, seed, rank, world, **kw)
        self.bucket_size = bucket_size

    def _extra(self) -> dict:
        return {"bucket_size": self.bucket_size}

    def sorted_buckets(self, rng: np.random.Generator) -> np.ndarray:
        """The epoch's pool, sorted by length within consecutive buckets of `bucket_size` records."""
        pool = self.epoch_pool(rng)
        bucket_of = np.arange(len(pool)) // self.bucket_size
        return pool[np.lexsort((self.lengths[pool], bucket_of))]  # stable: ties keep the random order

    def cut(self, rows: np.ndarray) -> list[np.ndarray]:
        # Every micro-batch has micro_batch_size rows whatever the bucket size (a sampler knob must
        # not change the batch size); one may straddle two buckets when they are not a multiple of it.
        return _cut(rows, self.micro_batch_size)

    def global_batches(self, epoch: int) -> list[np.ndarray]:
        rng = self._rng(epoch)
        batches = self.cut(self.sorted_buckets(rng))
        return [batches[i] for i in rng.permutation(len(batches))]


class BudgetSampler(BucketSampler):
    """Bucket to pair with a token budget: walking the length-sorted buckets, a micro-batch takes rows
    while rows x padded length (packed: the sum of padded lengths) stays <= `max_tokens`."""

    kind = "budget"
    size_key = "sampler.max_tokens"

    def __init__(self, lengths, seed, bucket_size: int, max_tokens: int, rank: int = 0, world: int = 1, **kw) -> None:
        require_resolved(max_tokens, "the budget sampler")
        super().__init__(lengths, 1, seed, bucket_size, rank, world, **kw)
        self.max_tokens = max_tokens
        longest = int(padded_len(int(self.lengths.max()), self.pad_to_multiple_of)) if len(self.lengths) else 0
        if longest > max_tokens:
            raise ConfigError("sampler.max_tokens", f"must hold the longest record ({longest} tokens after padding "
                                                    f"to a multiple of {self.pad_to_multiple_of})", max_tokens)

    def _extra(self) -> dict:
        return {"bucket_size": self.bucket_size, "max_tokens": self.max_tokens}

    def cut(self, rows: np.ndarray) -> list[np.ndarray]:
        return budget_cut(rows, self.lengths, self.max_tokens, self.pad_to_multiple_of, self.packed)


def budget_cut(rows: np.ndarray, lengths: np.ndarray, max_tokens: int, pad_to_multiple_of: int = 1,
               packed: bool = False) -> list[np.ndarray]:
    """`rows` in their order, cut into runs of neighbours that each take rows while rows x padded length
    (packed: the sum of the padded row lengths) stays <= `max_tokens`; a row longer than the budget
    alone is a micro-batch of its own (callers refuse such a budget first). Shared by the budget
    sampler and GRPO's rollout micro-batches (align/objectives/rollout.py)."""
    plen = padded_len(np.asarray(lengths)[rows], pad_to_multiple_of).tolist()
    cuts: list[int] = []
    n_rows, width, total = 0, 0, 0
    for i, n in enumerate(plen):
        w, t = max(width, n), total + n
        if n_rows and (t if packed else w * (n_rows + 1)) > max_tokens:
            cuts.append(i)
            n_rows, w, t = 0, n, n
        n_rows, width, total = n_rows + 1, w, t
    return np.split(rows, cuts) if len(rows) else []


def build_sampler(cfg: SamplerConfig, lengths: np.ndarray, seed: int, rank: int = 0, world: int = 1,
                  mixture: Optional[tuple[np.ndarray, Sequence[float]]] = None) -> MicroBatchSampler:
    kw = dict(pad_to_multiple_of=cfg.pad_to_multiple_of, packed=cfg.packed, mixture=mixture)
    if cfg.kind == SamplerKind.budget:
        assert cfg.max_tokens is not None
        return BudgetSampler(lengths, seed, cfg.bucket_size, cfg.max_tokens, rank, world, **kw)
    if cfg.kind == SamplerKind.bucket:
        return BucketSampler(lengths, cfg.micro_batch_size, seed, cfg.bucket_size, rank, world, **kw)
    return ShuffleSampler(lengths, cfg.micro_batch_size, seed, rank, world, **kw)
