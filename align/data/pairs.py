"""Micro-batches of preference pairs: a pair's two sides always land in the same micro-batch.

The run's sampler (shuffle, bucket or budget: align/data/samplers.py, unchanged) draws PAIRS: it sees
one unit per pair, whose length is what the pair costs in the micro-batch:
- packed: both sides' tokens (chosen + rejected), as a packed row holds them;
- padded: two rows of the longer side's padded width (2 x padded max(chosen, rejected)), so the
  budget sampler's rows x width is exactly the tokens the padded micro-batch computes, and bucketing
  sorts by the width that sets the padding.
`PairSampler` wraps it and hands out SEQUENCE rows (pair p -> rows 2p, 2p + 1, adjacent), so the
stream, its resume position and checkpoint, the padding and roots-per-window statistics and the
manifest's sampler stats all work on what collate builds. `collate_pairs` is collate (padded, or
packed with restarting position ids and no mask: sequences never attend to each other) plus the pair
fields of `Batch` (seq_ids, chosen_seq, rejected_seq, pairs, truncated_pairs, pair_rows, margin).
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from align.config import TrainConfig
from align.data.collate import IGNORE, Batch, collate
from align.data.loader import BatchStream
from align.data.preference import EncodedPairs
from align.data.samplers import MicroBatchSampler, ShuffleSampler, build_sampler, padded_len
from align.data.stats import DataStats, plan_stats, root_codes


def pair_units(pairs: EncodedPairs, packed: bool, pad_to_multiple_of: int = 1) -> np.ndarray:
    """The length the sampler sees per pair: the tokens the pair adds to a micro-batch (module doc)."""
    chosen, rejected = pairs.side_lengths
    if packed:
        return chosen + rejected
    return 2 * padded_len(np.maximum(chosen, rejected), pad_to_multiple_of)


def sequence_rows(pair_batch: np.ndarray) -> np.ndarray:
    """Pairs p -> their sequence rows [2p, 2p + 1, ...] (chosen, then rejected, pair by pair)."""
    p = np.asarray(pair_batch, dtype=np.int64)
    return np.stack([2 * p, 2 * p + 1], axis=1).reshape(-1)


class PairSampler(MicroBatchSampler):
    """`inner` draws pairs; this sampler's batches are the pairs' sequence rows, adjacent by pair.
    `lengths` are the SEQUENCE lengths (what collate and the padding statistics read)."""

    def __init__(self, inner: MicroBatchSampler, seq_lengths: np.ndarray) -> None:
        super().__init__(seq_lengths, inner.micro_batch_size, inner.seed, inner.rank, inner.world,
                         pad_to_multiple_of=inner.pad_to_multiple_of, packed=inner.packed)
        self.inner = inner
        self.kind = inner.kind
        self.mixture = inner.mixture

    def global_batches(self, epoch: int) -> list[np.ndarray]:
        return [sequence_rows(b) for b in self.inner.global_batches(epoch)]

    def fingerprint(self) -> str:
        return hashlib.sha256(f"pairs|{self.inner.fingerprint()}".encode()).hexdigest()

    def shuffle_baseline(self, rows: int) -> MicroBatchSampler:
        """A pure shuffle of PAIRS (rows // 2 per micro-batch), since the pair sampler never splits one."""
        shuffle = ShuffleSampler(self.inner.lengths, max(1, rows // 2), self.seed, mixture=None)
        shuffle.mixture = self.inner.mixture
        return PairSampler(shuffle, self.lengths)

    def stats(self) -> dict:
        out = super().stats()
        mine = self.inner.rank_batches(0)
        out.update(unit="pair", pairs_per_micro_batch_epoch0=float(np.mean([len(b) for b in mine])) if mine else 0.0)
        return out


def build_pair_sampler(cfg: TrainConfig, pairs: EncodedPairs, rank: int = 0, world: int = 1) -> PairSampler:
    """The configured sampler over pair units (mixture weights per pair source), wrapped."""
    from align.data.sources import source_specs

    weights = [s.weight for s in source_specs(cfg.data)]
    units = pair_units(pairs, cfg.sampler.packed, cfg.sampler.pad_to_multiple_of)
    mixture = (pairs.source_index[0::2], weights)
    inner = build_sampler(cfg.sampler, units, cfg.trainer.seed, rank, world, mixture=mixture)
    return PairSampler(inner, pairs.lengths)


def collate_pairs(data: EncodedPairs, rows: np.ndarray, pad_id: int, pad_to_multiple_of: int = 1, packed: bool = False,
                  mask_padding: bool = True) -> Batch:
    """A micro-batch of whole pairs: `rows` are sequence rows, pair by pair (chosen 2p, rejected 2p + 1)."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) % 2 or np.any(rows[0::2] % 2) or np.any(rows[1::2] != rows[0::2] + 1):
        raise ValueError(f"rows must be whole pairs, chosen then rejected (2p, 2p + 1, ...); got {rows.tolist()[:8]}")
    b = collate(data, rows, pad_id, pad_to_multiple_of, packed, mask_padding)
    n = len(rows)
    if packed:
        lens = data.lengths[rows]
        seq = np.full(b.input_ids.shape[1], -1, dtype=np.int64)
        seq[: int(lens.sum())] = np.repeat(np.arange(n), lens)
        seq_ids = torch.from_numpy(seq)[None]
    else:
        seq_ids = torch.arange(n, dtype=torch.int64)[:, None].expand(b.labels.shape).clone()
    b.seq_ids = seq_ids.masked_fill(b.labels == IGNORE, -1)
    b.chosen_seq = torch.arange(0, n, 2, dtype=torch.int64)
    b.rejected_seq = torch.arange(1, n, 2, dtype=torch.int64)
    b.pairs = n // 2
    b.pair_rows = rows[0::2] // 2
    b.truncated_pairs = int(data.truncated[b.pair_rows].sum())
    margin = getattr(data, "margin", None)
    if margin is not None:  # float32 as TRL's collator makes the column (DataCollatorForPreference)
        b.margin = torch.as_tensor(margin[b.pair_rows], dtype=torch.float32)
    return b


def build_pair_stream(cfg: TrainConfig, pairs: EncodedPairs, pad_id: int, rank: int = 0, world: int = 1,
                      pin_memory: bool = False) -> BatchStream:
    """The preference objective's one call: pair sampler, resumable stream of pair micro-batches and
    its statistics (padding waste, roots per window) over what collate builds."""
    sampler = build_pair_sampler(cfg, pairs, rank, world)
    sampler.plan = plan_stats(sampler, root_codes(pairs.roots), cfg.trainer.grad_accum * world)
    return BatchStream(pairs, sampler, pad_id, cfg.sampler.pad_to_multiple_of, packed=cfg.sampler.packed,
                       pin_memory=pin_memory, stats=DataStats(pairs, sampler.plan),
                       mask_padding=cfg.sampler.mask_padding, collate_fn=collate_pairs)


def hold_out(pairs: EncodedPairs, k: int) -> tuple[EncodedPairs, EncodedPairs]:
    """(the first `k` pairs, the rest), each its own EncodedPairs with its own fingerprint: a run that
    holds out pairs (objective.eval_pairs) samples, checkpoints and resumes on the rest only."""
    from align.data.preference import pairs_fingerprint

    def part(lo: int, hi: int) -> EncodedPairs:
        a, b = pairs.offsets[2 * lo], pairs.offsets[2 * hi]
        stats = {**pairs.stats, "pairs": hi - lo, "heldout_pairs_first": k}
        sub = EncodedPairs(tokens=pairs.tokens[a:b], loss_mask=pairs.loss_mask[a:b],
                           offsets=pairs.offsets[2 * lo: 2 * hi + 1] - a, ids=pairs.ids[2 * lo: 2 * hi],
                           roots=pairs.roots[2 * lo: 2 * hi], stats=stats,
                           source_index=pairs.source_index[2 * lo: 2 * hi],
                           meta={**pairs.meta, "fingerprint": None}, truncated=pairs.truncated[lo:hi],
                           pair_ids=pairs.pair_ids[lo:hi],
                           margin=None if pairs.margin is None else pairs.margin[lo:hi])
        pairs_fingerprint(sub)
        return sub

    return part(0, k), part(k, pairs.pairs)
