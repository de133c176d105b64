"""objective=kto's loss against TRL 1.16's KTOTrainer, which keeps it inside `_compute_loss`: the trainer is
built with object.__new__ and given only the attributes that code reads (checked against its signature),
and its model forward is replaced by per-token outputs that carry our log-probs (as
tests/unit/objectives/test_preference_losses.py does for DPO). The KL sequences and the KL point are
compared end to end: TRL's own dataset preparation and collator against align's encoded examples."""

from __future__ import annotations

import inspect
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from align.objectives.kto_loss import LOSSES, KTOLogps, kl_reference_point, kto_loss
from tests.unit.data.conftest import write_jsonl

N = 6
TOL = dict(rtol=1e-5, atol=1e-5)


def _accelerator() -> SimpleNamespace:
    return SimpleNamespace(device=torch.device("cpu"), gather=lambda t: t, gather_for_metrics=lambda t: t)


class _Model(torch.nn.Module):
    """Stands in for the fused-LM-head model KTOTrainer calls: the log-prob of token y is `table[y]` at any
    position, zero where the label is ignored."""

    is_gradient_checkpointing = False

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table

    def forward(self, input_ids, labels, **kwargs) -> SimpleNamespace:
        lp = self.table[input_ids[:, 1:]] * (labels[:, 1:] != -100)
        return SimpleNamespace(log_probs=lp, entropy=torch.zeros_like(lp), mean_logits=torch.zeros_like(lp))


class _LM(_Model):
    """A language model of two tables: the logits after token x in a sequence whose prompt's sixth token
    is p are `pairs[x] + prompts[p % 7]`, so a completion's log-prob depends on the prompt it follows."""

    def __init__(self, pairs: torch.Tensor, prompts: torch.Tensor) -> None:
        super().__init__(pairs)
        self.prompts = prompts

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.table[input_ids] + self.prompts[input_ids[:, 5] % len(self.prompts)][:, None, :]

    def forward(self, input_ids, labels, **kwargs) -> SimpleNamespace:
        lp = torch.log_softmax(self.logits(input_ids)[:, :-1], -1).gather(2, input_ids[:, 1:, None])[..., 0]
        lp = lp * (labels[:, 1:] != -100)
        return SimpleNamespace(log_probs=lp, entropy=torch.zeros_like(lp), mean_logits=torch.zeros_like(lp))


def _trl_trainer(model, ref_model, *, beta, desirable_weight, undesirable_weight, precompute, loss_type="kto"):
    from trl.trainer.kto_trainer import KTOTrainer

    assert list(inspect.signature(KTOTrainer._compute_loss).parameters) == ["self", "model", "inputs",
                                                                           "return_outputs"]
    trainer = object.__new__(KTOTrainer)
    trainer.__dict__.update(model=model, ref_model=ref_model, accelerator=_accelerator(), aux_loss_enabled=False,
                            precompute_ref_logps=precompute, loss_type=loss_type, beta=beta,
                            calculate_KL=loss_type not in ["apo_zero_unpaired"],  # KTOTrainer.__init__'s rule
                            desirable_weight=desirable_weight, undesirable_weight=undesirable_weight,
                            args=SimpleNamespace(gradient_checkpointing_kwargs=None),
                            _metrics={"train": defaultdict(list)}, _total_train_tokens=0, _tp_size=1)
    return trainer


def _trl_on_sums(x: KTOLogps, loss_type: str = "kto", **hp) -> tuple[torch.Tensor, dict]:
    """TRL on sequences whose completions are one token each: the table holds each sequence's sum."""
    ids = torch.arange(2 * N).reshape(2, N)  # completion token of example e: e; of its KL sequence: N + e
    table = torch.cat([x.policy, x.policy_kl])
    inputs = {"input_ids": torch.stack([torch.full((N,), 2 * N), ids[0]], 1),
              "KL_input_ids": torch.stack([torch.full((N,), 2 * N), ids[1]], 1),
              "attention_mask": torch.ones(N, 2, dtype=torch.long),
              "KL_attention_mask": torch.ones(N, 2, dtype=torch.long),
              "completion_mask": torch.tensor([[0, 1]] * N), "KL_completion_mask": torch.tensor([[0, 1]] * N),
              "label": x.desirable, "ref_logps": x.reference, "ref_KL_logps": x.reference_kl}
    model = _Model(torch.cat([table, table.new_zeros(1)]))
    trainer = _trl_trainer(model, None, precompute=True, loss_type=loss_type, **hp)
    loss = trainer._compute_loss(model, inputs, return_outputs=False)
    return loss, {k: v[-1] for k, v in trainer._metrics["train"].items()}


def _batch(seed: int, kl_shift: float, labels: list[bool]) -> KTOLogps:
    g = torch.Generator().manual_seed(seed)
    r = lambda: -20 * torch.rand(N, generator=g, dtype=torch.float64).float()  # noqa: E731
    policy, reference, reference_kl = r(), r(), r()
    return KTOLogps(policy=policy.requires_grad_(), reference=reference,
                    policy_kl=(reference_kl + kl_shift + torch.randn(N, generator=g)).requires_grad_(),
                    reference_kl=reference_kl, desirable=torch.tensor(labels))


MIXED = [True, False, True, True, False, False]
CASES = [  # (seed, KL shift: a positive, and a negative point that TRL clamps at 0, labels, hyper-parameters)
    (0, 2.0, MIXED, dict(beta=0.1, desirable_weight=1.0, undesirable_weight=1.0)),
    (1, -3.0, MIXED, dict(beta=0.5, desirable_weight=1.33, undesirable_weight=0.7)),
    (2, 5.0, [True] * N, dict(beta=0.05, desirable_weight=2.0, undesirable_weight=1.0)),
    (3, 0.5, [False] * N, dict(beta=1.0, desirable_weight=1.0, undesirable_weight=3.0)),
]


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("seed,shift,labels,hp", CASES, ids=["equal", "clamped", "desirable_only", "undesirable_only"])
def test_the_loss_its_gradient_and_metrics_equal_trls(seed, shift, labels, hp, loss):
    x = _batch(seed, shift, labels)
    out = kto_loss(x, kl_reference_point(x.policy_kl, x.reference_kl), loss=loss, **hp)
    ours = out.losses.mean()  # TRL's nanmean of one batch: the window of one micro-batch on one rank
    ours_grad, ours_kl_grad = torch.autograd.grad(ours, [x.policy, x.policy_kl], allow_unused=True)

    y = _batch(seed, shift, labels)
    theirs, metrics = _trl_on_sums(y, loss, **hp)
    theirs_grad, theirs_kl_grad = torch.autograd.grad(theirs, [y.policy, y.policy_kl], allow_unused=True)
    torch.testing.assert_close(ours, theirs, **TOL)
    torch.testing.assert_close(ours_grad, theirs_grad, **TOL)
    for g in (ours_kl_grad, theirs_kl_grad):  # the KL point carries no gradient
        assert g is None or not g.any(), g
    if loss == "kto":
        assert out.kl.item() == pytest.approx(metrics["kl"], abs=1e-5)
    else:  # TRL computes no KL point (logs 0); align reports the estimate its loss does not read
        assert metrics["kl"] == 0.0 and out.kl.item() == kl_reference_point(x.policy_kl, x.reference_kl).item()
    if shift < 0:
        assert out.kl.item() == 0.0
    s = out.metric_sums(torch.zeros(N, dtype=torch.bool))
    for side in ("chosen", "rejected"):
        if s[f"n/{side}"]:
            for what in ("rewards", "logps"):
                assert (s[f"{what}/{side}"] / s[f"n/{side}"]).item() == pytest.approx(metrics[f"{what}/{side}"],
                                                                                       abs=1e-5)
        else:
            assert f"rewards/{side}" not in metrics


@pytest.fixture(scope="module")
def trl_and_align(tmp_path_factory, tokenizer):
    """Five conversational records, prepared by TRL (one batch: its KL rotation over all of them) and
    encoded by align."""
    from datasets import Dataset
    from trl import KTOConfig
    from trl.trainer.kto_trainer import KTOTrainer

    from align.data.unpaired import load_examples_encoded
    from tests.unit.data.test_preference import train_cfg

    rows = [{"prompt": [{"role": "user", "content": f"what is {i} + {i}?"}],
             "completion": [{"role": "assistant", "content": f"it is {2 * i}" + " really" * i}],
             "label": i % 3 != 0} for i in range(5)]
    args = KTOConfig(output_dir=str(tmp_path_factory.mktemp("trl")), per_device_train_batch_size=len(rows),
                     report_to=[], use_cpu=True, bf16=False)
    stub = SimpleNamespace(calculate_KL=True, _tokenizer=tokenizer, desirable_weight=1.0, undesirable_weight=1.0)
    assert "dataset_name" in inspect.signature(KTOTrainer._prepare_dataset).parameters
    trl = list(KTOTrainer._prepare_dataset(stub, Dataset.from_list(rows), tokenizer, args, "train"))
    d = tmp_path_factory.mktemp("align")
    ours = load_examples_encoded(train_cfg(d, write_jsonl(d / "kto.jsonl", rows), objective="kto"), tokenizer)
    return trl, ours, args


def test_every_kl_sequence_is_the_prompt_with_the_completion_trl_rotates_in(trl_and_align):
    trl, ours, _ = trl_and_align
    assert ours.pairs == len(trl) and ours.labels.tolist() == [r["label"] for r in trl]
    for e, r in enumerate(trl):
        for k, completion in enumerate((r["completion_ids"], r["KL_completion_ids"])):
            tokens, mask = ours.row(2 * e + k)
            assert tokens.tolist() == r["prompt_ids"] + completion
            assert mask.tolist() == [False] * len(r["prompt_ids"]) + [True] * len(completion)
        assert r["KL_completion_ids"] != r["completion_ids"]  # a mismatched pair, not the example's own


def test_the_kl_point_and_loss_of_align_s_batch_equal_trls_on_its_own(trl_and_align):
    """Policy and reference are two small language models whose log-probs of a completion depend on the
    prompt it follows (`_LM`), so a KL sequence's differ from its completion's; TRL collates its prepared examples and
    forwards the reference itself, align sums its encoded rows: the same KL point, the same loss."""
    from trl.trainer.kto_trainer import DataCollatorForUnpairedPreference

    from align.data.pairs import collate_pairs, sequence_rows
    from align.objectives.logps import sequence_sums, token_logps

    trl, ours, _ = trl_and_align
    g = torch.Generator().manual_seed(0)
    vocab = 1 + max(max(r["prompt_ids"] + r["completion_ids"]) for r in trl)
    policy, reference = (_LM(torch.randn(vocab, vocab, generator=g), 3 * torch.randn(7, vocab, generator=g))
                         for _ in range(2))
    hp = dict(beta=0.3, desirable_weight=1.2, undesirable_weight=0.8)

    batch = DataCollatorForUnpairedPreference(pad_token_id=0)(trl)
    trainer = _trl_trainer(policy, reference, precompute=False, **hp)
    theirs = trainer._compute_loss(trainer.model, batch, return_outputs=False)

    b = collate_pairs(ours, sequence_rows(list(range(ours.pairs))), pad_id=0)
    sums = {}
    for name, lm in (("policy", policy), ("reference", reference)):
        values, keep = token_logps(lm.logits(b.input_ids), b.labels)
        sums[name] = sequence_sums(values, keep, b.seq_ids, 2 * b.pairs)
    x = KTOLogps(policy=sums["policy"][b.chosen_seq], reference=sums["reference"][b.chosen_seq],
                 policy_kl=sums["policy"][b.rejected_seq], reference_kl=sums["reference"][b.rejected_seq],
                 desirable=torch.as_tensor(ours.labels))
    out = kto_loss(x, kl_reference_point(x.policy_kl, x.reference_kl), **hp)
    assert out.kl.item() == pytest.approx(trainer._metrics["train"]["kl"][-1], abs=1e-5)
    assert out.kl.item() > 0  # the two tables differ: a point that is not the clamp's
    torch.testing.assert_close(out.losses.mean(), theirs, **TOL)
