"""objective=grpo with sampler=budget: each step's completions sorted by length and cut by the budget
sampler's own cut, as many micro-batches on every rank, the step's loss and gradient the same whatever the
cut (for every loss aggregation), packed micro-batches that never attend across sequences."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from align.config import SamplerConfig, SamplerKind
from align.data.samplers import batch_shapes, budget_cut
from align.errors import AlignError
from align.objectives.policy_loss import Aggregation, LossSpec, per_token_loss
from align.objectives.rollout import Rollout, split_to
from tests.conftest import build_trainer

SMALL = ["objective=grpo", "objective.group_size=4", "objective.prompts_per_rollout=4", "trainer.max_steps=2",
         "trainer.export=false", "trainer.device=cpu", "sampler=budget"]


def _rollout(lengths: list[int], prompt: int = 2) -> Rollout:
    """A rollout of sequences of the given lengths (prompt + completion), contents irrelevant to the cut."""
    lens = np.asarray(lengths, dtype=np.int64)
    n, completion = len(lens), int((lens - prompt).sum())
    return Rollout(index=0, rows=np.arange(n), group=np.arange(n) // 2, prompt_lens=np.full(n, prompt),
                   tokens=np.ones(int(lens.sum()), dtype=np.int32),
                   offsets=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
                   engine_logps=np.zeros(completion, np.float32), sampler_logps=np.zeros(completion, np.float32),
                   rewards=np.zeros(n), advantages=np.zeros(n), stopped=np.ones(n, dtype=bool))


def _budget(max_tokens: int, packed: bool = False, mult: int = 1) -> SamplerConfig:
    return SamplerConfig(kind=SamplerKind.budget, max_tokens=max_tokens, packed=packed, pad_to_multiple_of=mult)


@pytest.mark.parametrize("packed", [False, True])
def test_each_part_is_its_steps_sequences_sorted_and_cut_by_the_budget_samplers_cut(packed):
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 20, size=24).tolist()
    r = _rollout(lengths)
    cfg = _budget(40, packed, mult=4)
    r.cut_budget(3, cfg)
    lens = np.asarray(lengths)
    for step, part in zip(np.array_split(np.arange(24), 3), r.parts):
        flat = np.concatenate(part)
        assert sorted(flat.tolist()) == step.tolist()  # a step replays its own sequences, each once
        assert (np.diff(lens[flat]) >= 0).all()  # neighbours by length
        ordered = step[np.argsort(lens[step], kind="stable")]
        assert [p.tolist() for p in part] == [p.tolist() for p in budget_cut(ordered, lens, 40, 4, packed)]
        computed, _ = batch_shapes(part, lens, 4, packed)
        assert (computed <= 40).all() and len(part) > 1


def test_a_rank_with_fewer_micro_batches_halves_its_largest_to_the_agreed_count():
    lengths = [4, 4, 4, 4, 4, 4, 10, 10, 10, 10]
    r = _rollout(lengths)
    r.cut_budget(1, _budget(40))
    mine = len(r.parts[0])
    r.cut_budget(1, _budget(40), agree=lambda counts: [c + 3 for c in counts])  # another rank has 3 more
    part = r.parts[0]
    assert len(part) == mine + 3 and all(len(p) for p in part)
    assert sorted(np.concatenate(part).tolist()) == list(range(10))
    # the largest were split first: the rows x length product of the largest is now as small as it can get
    computed, _ = batch_shapes(part, np.asarray(lengths), 1, False)
    assert computed.max() <= 20


def test_split_to_never_makes_an_empty_micro_batch():
    lens = np.array([5, 5, 5])
    out = split_to([np.array([0, 1, 2])], 3, lens)
    assert [b.tolist() for b in out] == [[0], [1], [2]]
    with pytest.raises(ValueError, match="cannot be cut"):
        split_to([np.array([0, 1, 2])], 4, lens)


# ------------------------------------------------------------------ in a trainer (tiny model, CPU)


@pytest.fixture(scope="module")
def budget_trainer(tmp_path_factory):
    trainer = build_trainer(tmp_path_factory.mktemp("grpo_budget"), *SMALL, "sampler.max_tokens=64")
    trainer.train_step(iter(trainer.stream))
    return trainer


def _window_grads(trainer, window) -> tuple[float, list[torch.Tensor]]:
    """The step's loss and gradient as train_step makes them: the objective's summed micro-batch losses over
    the window's unit count, through the trainer's own forward_backward."""
    obj = trainer.objective
    trainer.model.zero_grad(set_to_none=True)
    denom = sum(obj.weight(b) for b in window)
    loss = sum(float(trainer.forward_backward(b, denom)) for b in window)
    return loss, [p.grad.detach().clone() for p in trainer.model.parameters() if p.grad is not None]


def _expected(trainer, seqs: np.ndarray) -> float:
    """The aggregation's definition over the step's sequences, from per-token losses of each sequence alone."""
    obj = trainer.objective
    per_seq = []
    with torch.no_grad():
        for s in seqs:
            b = obj._batch(np.array([s]), with_old=True)
            logp = obj.target_logps(trainer.forward, b)
            seq = torch.zeros(len(logp), dtype=torch.long)
            loss, _ = per_token_loss(logp, b.old_logps, b.advantages.index_select(0, seq), seq, 1, obj.spec)
            per_seq.append(loss)
    how = obj.spec.aggregation
    if how == Aggregation.token_mean:
        return float(torch.cat(per_seq).sum() / sum(len(x) for x in per_seq))
    if how == Aggregation.seq_mean_token_mean:
        return float(sum(x.mean() for x in per_seq) / len(per_seq))
    return float(sum(x.sum() for x in per_seq) / len(per_seq))


@pytest.mark.parametrize("agg", list(Aggregation))
def test_the_steps_loss_and_gradient_do_not_depend_on_the_cut(budget_trainer, agg):
    """One micro-batch holding the whole part vs the budget's cut of it: the same loss and gradient (float
    tolerance), and both the aggregation's definition. Advantages and old log-probs are planted so that the
    ratio differs from 1 and every sequence counts."""
    trainer = budget_trainer
    obj, r = trainer.objective, trainer.objective.rollout
    obj.spec = LossSpec(aggregation=agg)
    rng = np.random.default_rng(1)
    r.advantages = rng.normal(size=r.size)
    r.old_logps = (r.engine_logps + rng.normal(scale=0.3, size=r.engine_logps.shape)).astype(np.float32)
    part = r.parts[0]
    assert len(part) > 1, "the budget must cut the part for this test to mean anything"
    whole = np.concatenate(part)
    one = [obj._batch(whole, with_old=True)]
    cut = [obj._batch(seqs, with_old=True) for seqs in part]
    loss_one, grad_one = _window_grads(trainer, one)
    loss_cut, grad_cut = _window_grads(trainer, cut)
    assert loss_one == pytest.approx(_expected(trainer, whole), rel=1e-5, abs=1e-6)
    assert loss_cut == pytest.approx(loss_one, rel=1e-5, abs=1e-6)
    assert len(grad_one) == len(grad_cut) and any(g.abs().sum() > 0 for g in grad_one)
    for a, b in zip(grad_one, grad_cut):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    r.old_logps = None
    trainer.model.zero_grad(set_to_none=True)


def test_a_packed_budget_micro_batch_gives_each_completion_its_own_log_probs(tmp_path):
    """sampler=budget with packed=true: a micro-batch of several completions in one row, positions restarting
    per sequence; every token's log-prob equals that of its sequence padded alone (no cross attention)."""
    trainer = build_trainer(tmp_path, *SMALL, "sampler.max_tokens=64", "sampler.packed=true")
    trainer.train_step(iter(trainer.stream))
    obj = trainer.objective
    seqs = max(obj.rollout.parts[0], key=len)
    packed = obj._batch(seqs, with_old=False)
    assert len(seqs) > 1 and packed.input_ids.shape[0] == 1 and packed.position_ids is not None
    assert packed.attention_mask is None and packed.tokens <= 64
    with torch.no_grad():
        together = obj.target_logps(trainer.forward, packed)
        s = trainer.cfg.sampler
        alone = [obj.rollout.batch(np.array([q]), trainer.tokenizer.pad_token_id, s.pad_to_multiple_of, False,
                                   True, with_old=False) for q in seqs]
        alone = torch.cat([obj.target_logps(trainer.forward, b) for b in alone])
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-5)


def test_a_budget_that_shrank_mid_rollout_is_refused(budget_trainer):
    trainer = budget_trainer
    obj = trainer.objective
    obj.rollout.served = 0
    saved = trainer.cfg.sampler.max_tokens
    trainer.cfg.sampler.max_tokens = 16  # smaller than the micro-batches the rollout was cut into
    try:
        with pytest.raises(AlignError, match="over sampler.max_tokens=16: the sampler changed mid-rollout"):
            obj.next_window(iter(trainer.stream), 1, trainer.env.device)
    finally:
        trainer.cfg.sampler.max_tokens = saved
    assert obj.next_window(iter(trainer.stream), 1, trainer.env.device)  # as cut: served


def test_the_engine_generates_under_the_trainers_autocast(tmp_path):
    """The objective's autocast is the trainer's (align.parallel.env.autocast_dtype of trainer.precision)."""
    for precision, want in (("bf16", torch.bfloat16), ("fp32", None)):
        trainer = build_trainer(tmp_path / precision, *SMALL, "sampler.max_tokens=64", f"trainer.precision={precision}")
        for ctx in (trainer.objective.autocast, trainer.autocast):
            with ctx():
                on = torch.is_autocast_enabled("cpu")
                assert on == (want is not None) and (not on or torch.get_autocast_dtype("cpu") == want), precision


def test_a_budget_cut_survives_the_buffers_checkpoint_round_trip():
    r = _rollout([3, 9, 4, 12, 5, 7, 6, 8])
    r.cut_budget(2, _budget(24), agree=lambda counts: [c + 1 for c in counts])
    back = Rollout.from_state_dict(r.state_dict())
    assert [[p.tolist() for p in s] for s in back.parts] == [[p.tolist() for p in s] for s in r.parts]
    assert back.misfit(back.parts[0], 1, _budget(24)) is None
