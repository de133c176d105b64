"""BatchStream: a mid-epoch resume lands on the exact next micro-batch (also across an epoch
boundary and with a prefetching DataLoader), and a resume under another world size, data set or
sampler setting is refused (docs/pitfalls.md#15)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from align.config import SamplerConfig, SamplerKind
from align.data.encode import EncodedDataset
from align.data.loader import BatchStream
from align.data.samplers import build_sampler
from align.errors import ConfigError


def synthetic(n=101, seed=0) -> EncodedDataset:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 40, size=n)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(10, 1000, size=offsets[-1]).astype(np.int32)
    return EncodedDataset(tokens=tokens, loss_mask=rng.random(offsets[-1]) < 0.6, offsets=offsets,
                          ids=[f"s:{i}" for i in range(n)], roots=[f"r{i % 5}" for i in range(n)])


def stream(data, kind=SamplerKind.bucket, rank=0, world=1, workers=0, **kw) -> BatchStream:
    cfg = SamplerConfig(kind=kind, micro_batch_size=4, bucket_size=16, **kw)
    return BatchStream(data, build_sampler(cfg, data.lengths, 11, rank, world), pad_id=0, num_workers=workers)


def _rows(batches):
    return [b.rows.tolist() for b in batches]


@pytest.mark.parametrize("kind", [SamplerKind.shuffle, SamplerKind.bucket])
@pytest.mark.parametrize("k", [0, 7, 25, 26, 60])  # 25/26: one epoch is 26 micro-batches (101 rows / 4)
def test_resume_lands_on_the_exact_next_micro_batch(kind, k):
    data = synthetic()
    ref = stream(data, kind)
    it = iter(ref)
    consumed = [next(it) for _ in range(k)]
    state = ref.state_dict()
    expected = _rows(itertools.islice(it, 10))

    resumed = stream(data, kind)
    resumed.load_state_dict(state)
    got = list(itertools.islice(iter(resumed), 10))
    assert _rows(got) == expected
    # ... and the resumed batches are the same tensors, not just the same rows.
    again = list(itertools.islice(iter(ref), 0))
    assert again == [] and len(consumed) == k


def test_position_counts_consumed_batches_not_prefetched_ones():
    data = synthetic()
    ref = stream(data, workers=2)
    it = iter(ref)
    [next(it) for _ in range(5)]  # the loader has prefetched more than 5 by now
    state = ref.state_dict()
    assert (state["epoch"], state["index"]) == (0, 5)
    resumed = stream(data)
    resumed.load_state_dict(state)
    assert _rows(itertools.islice(iter(resumed), 3)) == _rows(itertools.islice(it, 3))


def test_ranks_resume_their_own_shard():
    data = synthetic()
    world = 2
    refs = [stream(data, rank=r, world=world) for r in range(world)]
    its = [iter(s) for s in refs]
    for it in its:
        [next(it) for _ in range(9)]
    for r in range(world):
        resumed = stream(data, rank=r, world=world)
        resumed.load_state_dict(refs[r].state_dict())
        assert _rows(itertools.islice(iter(resumed), 4)) == _rows(itertools.islice(its[r], 4))


@pytest.mark.parametrize("change", ["world", "data", "sampler"])
def test_resume_under_other_settings_is_refused(change):
    data = synthetic()
    ref = stream(data, world=2)
    state = ref.state_dict()
    other = {"world": lambda: stream(data, world=1),
             "data": lambda: stream(synthetic(seed=1), world=2),
             "sampler": lambda: stream(data, world=2, pad_to_multiple_of=8)}[change]()
    with pytest.raises(ConfigError, match="resume"):
        other.load_state_dict(state)
    stream(data, world=2).load_state_dict(state)  # the same settings resume
    other.load_state_dict(state, strict=False)  # trainer.resume_despite_mismatch: loaded, with a warning
    assert (other.position.epoch, other.position.index) == (state["epoch"], state["index"])


def test_iterating_a_stream_leaves_the_global_torch_rng_alone():
    """A DataLoader iterator draws its base seed from the global torch RNG unless it has a generator of
    its own; a resumed run then drew it after restoring that RNG and its dropout masks diverged from
    the uninterrupted run's (tests/integration/test_resume_exact.py has the end-to-end check)."""
    import torch

    s = stream(synthetic())
    before = torch.get_rng_state()
    it = iter(s)
    for _ in range(len(s.sampler.rank_batches(0)) + 1):  # across an epoch boundary: a second loader
        next(it)
    assert torch.equal(torch.get_rng_state(), before)
