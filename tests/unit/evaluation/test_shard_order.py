"""`shard_order`: the ranks' shares cover every prompt once, each rank gets the same count (lockstep
decoding needs the same number of backend calls on every rank), and one rank gets them all in order."""

from __future__ import annotations

import pytest

from align.evaluation.runner import shard_order


@pytest.mark.parametrize("n,world", [(5, 2), (1, 4), (7, 3), (8, 2), (3, 1)])
def test_shares_cover_every_prompt_once_with_equal_counts(n, world):
    prompts = [[0] * (i % 4 + 1) for i in range(n)]
    shares = [shard_order(prompts, r, world) for r in range(world)]
    assert len({len(order) for order, _ in shares}) == 1
    own = sorted(i for order, real in shares for i in order[:real])
    assert own == list(range(n))


def test_one_rank_generates_longest_first_with_no_padding():
    prompts = [[0], [0, 0, 0], [0, 0]]
    assert shard_order(prompts, 0, 1) == ([1, 2, 0], 3)
