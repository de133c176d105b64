"""A Bradley-Terry reward model (`objective=reward_model`) on preference pairs, on DPO's pair machinery.

The data, sampler, packing and collate are DPO's (align/data/pairs.py): sequence 2p of a micro-batch is
pair p's prompt + chosen, 2p + 1 its prompt + rejected. The model is the causal LM's backbone under the
family's sequence-classification head (align/models/scalar_head.py); one forward gives every position's
score, and a sequence's reward is the score at its last non-pad token (`reward_positions`: per row when
padded, per document when packed). The per-pair loss is TRL's RewardTrainer loss
(align/objectives/reward_loss.py), summed; the loop divides by the window's global pair count.

`objective.eval_pairs` holds the first K pairs out of training: every `eval_every` steps the share of
them whose chosen side scores above the rejected one is `heldout/accuracy` in the step's row.

Each pair's `margin`, where the data carry one (align/data/margins.py), is subtracted inside the loss as
TRL's RewardTrainer does; the manifest's `margin` says whether it was.

The step-0 gate, before any update, on the first micro-batch this rank trains on:
- batching: every sequence's batched reward equals the reward transformers' own forward of the class gives
  that sequence alone (its pooled logit, no mask, no position ids). A reward read at the wrong token (a
  prompt's, a pad's, another document's) or documents attending to each other breaks it;
- loss: the loss the run computes on the batch's rewards (and margins) equals the configured loss computed by
  another formula (align/objectives/reward_loss.py `independent_losses`) on the margins read from the encoded
  pairs by row. A loss that drops the centring term, swaps the sides, or ignores or misreads the margins breaks
  it.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch

from align.config import TrainConfig
from align.config.reward_model_config import RewardModelConfig
from align.data import margins
from align.data.collate import Batch
from align.errors import ConfigError
from align.models.scalar_head import head_record, reward_positions, token_scores
from align.objectives import View, register
from align.objectives.dpo import DPO
from align.objectives.gate import BF16_TOLERANCE, FP32_TOLERANCE, GateError, _max_count
from align.objectives.plan_terms import PlanTerms
from align.objectives.reward_loss import bradley_terry_losses, independent_losses

NO_MARGIN = "the pairs carry no 'margin' field: the loss is -logsigmoid(r_chosen - r_rejected)"


class RewardModelTerms(PlanTerms):
    """A reward model: pairs through the sampler, two sequences each, nothing beside the model."""

    sequences_per_row = 2


def reward_view(cfg: Any, tokenizer: Any, index: int) -> View:
    """Pair `index` of the encoded pairs, both sequences, the token each reward is read at marked."""
    from align.data.preference import SIDES, load_pairs
    from align.objectives.views import _tokenizer_line, check_index

    pairs = load_pairs(cfg, tokenizer)
    check_index(index, pairs.pairs, "the encoded data set has {n} pairs")
    seqs = []
    for k, side in enumerate(SIDES):
        ids = pairs.row(2 * index + k)[0]
        at = reward_positions(pairs, np.array([2 * index + k]), len(ids), False, tokenizer.pad_token_id)[0]
        seqs.append((f"{side} (sequence {2 * index + k} of the encoded pairs)", ids.tolist(),
                     [i == at for i in range(len(ids))]))
    return View(header=[f"pair {index} of {pairs.pairs} (id {pairs.pair_ids[index]})",
                        _tokenizer_line(cfg, pairs.meta)],
                legend="the token each side's reward is read at (its last non-pad token); the rest: context",
                sequences=seqs)


@register
class RewardModel(DPO):
    name = "reward_model"
    terms = RewardModelTerms
    console_metrics = (("loss", "loss"), ("reward acc", "rewards/accuracy"), ("held-out acc", "heldout/accuracy"))
    view = staticmethod(reward_view)

    def __init__(self, cfg: TrainConfig) -> None:  # DPO's pair state, no reference
        self.cfg: RewardModelConfig = cfg.objective
        self.train_cfg = cfg
        self.loss = "bradley_terry"
        self.env = None
        self.resumed_at = False
        self.gate_report: Optional[dict[str, Any]] = None
        self._sums: dict[str, torch.Tensor] = {}
        self._pairs = 0
        self.steps = 0
        self.heldout = None

    def build_data(self, cfg: TrainConfig, tokenizer: Any, env: Any):
        from align.data.pairs import build_pair_stream, hold_out

        self.env, self.pad_id = env, tokenizer.pad_token_id
        self.pairs = self.load_data(cfg, tokenizer)
        k = self.cfg.eval_pairs
        if k:
            if k >= self.pairs.pairs:
                raise ConfigError("objective.eval_pairs", f"holds out every pair of the data ({self.pairs.pairs}): "
                                  "accepted: fewer, so some are left to train on", k)
            self.heldout, self.pairs = hold_out(self.pairs, k)
        stream = build_pair_stream(cfg, self.pairs, tokenizer.pad_token_id, env.rank, env.world,
                                   pin_memory=env.device.type == "cuda")
        return self.pairs, stream

    def prepare(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        return []

    def bind(self, model: torch.nn.Module, forward: Callable[..., torch.Tensor], resuming: bool = False) -> None:
        self.model, self.forward = model, forward
        self.resumed_at = resuming

    # -------------------------------------------------------------------------------- loss

    def rewards(self, forward: Callable, batch: Batch, data: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen, rejected) rewards [P] of the pairs of `batch` (rows of `data`, the training pairs by default)."""
        with token_scores(self.model) as got:
            forward(batch.model_inputs())
        scores = got[-1].float().reshape(-1)
        at = reward_positions(self.pairs if data is None else data, batch.rows, batch.input_ids.shape[1],
                              batch.packed, self.pad_id)
        r = scores[torch.as_tensor(at, device=scores.device)]
        return r[batch.chosen_seq], r[batch.rejected_seq]

    def loss_of(self, chosen: torch.Tensor, rejected: torch.Tensor, margin: Optional[torch.Tensor]) -> torch.Tensor:
        """[P] the configured per-pair losses (`margin`: the batch's, None without): what `micro_loss` and the
        gate both run."""
        return bradley_terry_losses(chosen, rejected, margin, self.cfg.center_rewards_coefficient)

    def micro_loss(self, forward: Callable[..., torch.Tensor], batch: Batch) -> torch.Tensor:
        chosen, rejected = self.rewards(forward, batch)
        losses = self.loss_of(chosen, rejected, batch.margin)
        with torch.no_grad():
            for k, v in (("rewards/accuracy", (chosen > rejected).float()), ("rewards/margin", chosen - rejected),
                         ("rewards/chosen", chosen), ("rewards/rejected", rejected)):
                self._sums[k] = self._sums.get(k, 0) + v.sum()
        self._pairs += batch.pairs
        return losses.sum()

    def window_metrics(self) -> dict[str, Any]:
        out = super().window_metrics()  # DPO's: each sum over the window's pairs, reduced over ranks
        self.steps += 1
        last = self.train_cfg.trainer.max_steps
        if self.heldout is not None and (self.steps % self.cfg.heldout_every() == 0 or self.steps == last):
            out["heldout/accuracy"] = self.heldout_accuracy()
        return out

    def heldout_accuracy(self) -> float:
        """The share of held-out pairs whose chosen side scores above its rejected side (every rank scores
        them all, in the same batches: a sharded forward is collective)."""
        was = self.model.training
        self.model.eval()
        right = 0
        try:
            with torch.no_grad():
                for b in self._batches(self.heldout):
                    chosen, rejected = self.rewards(self.forward, b.to(self._device()), self.heldout)
                    right += int((chosen > rejected).sum())
        finally:
            self.model.train(was)
        return right / self.heldout.pairs

    def _describe_margin(self) -> dict[str, Any]:
        """The manifest's `margin`: whether the loss subtracted each pair's, from which field, and their range
        over the pairs trained on (present-and-null: the same keys either way)."""
        m = self.pairs.margin
        if m is None:
            return {"present": False, "column": None, "pairs": 0, "min": None, "max": None, "mean": None,
                    "why": NO_MARGIN}
        return {"present": True, "column": margins.COLUMN, "pairs": len(m), "min": float(m.min()),
                "max": float(m.max()), "mean": float(m.mean()),
                "why": f"each pair's '{margins.COLUMN}': the loss is -logsigmoid(r_chosen - r_rejected - margin)"}

    def _batches(self, data: Any, per_batch: int = 8) -> Iterator[Batch]:
        from align.data.pairs import collate_pairs, sequence_rows

        pad = self.train_cfg.sampler.pad_to_multiple_of
        for start in range(0, data.pairs, per_batch):
            yield collate_pairs(data, sequence_rows(np.arange(start, min(start + per_batch, data.pairs))),
                                self.pad_id, pad)

    # ------------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state.get("steps", 0))

    # ---------------------------------------------------------------------------------- gate

    def gate(self, batch: Batch) -> dict[str, Any]:
        """The step-0 checks (module doc) on `batch`; raises GateError when one fails. Skipped on a resume."""
        if self.resumed_at:
            self.gate_report = {"ran": False, "why": "resumed: the model has trained since step 0"}
            return self.gate_report
        was = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                chosen, rejected = self.rewards(self.forward, batch)
                alone = self._alone_rewards(batch.rows)
        finally:
            self.model.train(was)
        batched = torch.stack([chosen, rejected], 1).reshape(-1)
        tol = self.cfg.gate_tolerance or (BF16_TOLERANCE if self._autocast_dtype() == torch.bfloat16
                                          else FP32_TOLERANCE)
        err = (batched - alone).abs().max().item()
        runs = self.loss_of(chosen, rejected, batch.margin).double()
        want = independent_losses(chosen, rejected, self._margin_of(batch), self.cfg.center_rewards_coefficient)
        loss_err = (runs - want).abs().max().item()
        loss_tol = 1e-5 * max(1.0, want.abs().max().item())
        report = {"ran": True, "pairs": int(batch.pairs), "margin": batch.margin is not None, "tolerance": tol,
                  "batching_max_abs": err,
                  "batching_ok": err <= tol, "loss_run": runs.sum().item(), "loss_expected": want.sum().item(),
                  "loss_max_abs_error": loss_err, "loss_ok": loss_err <= loss_tol}
        self.gate_report = report
        why = []
        if not report["batching_ok"]:
            why.append(f"batched rewards differ from each sequence's alone by {err:.3g} > tolerance {tol:g} (the "
                       "reward read at another token, or packed documents attending to each other)")
        if not report["loss_ok"]:
            with_margin = "the pairs' margins" if self.pairs.margin is not None else "no margin"
            why.append(f"the loss on this batch's rewards is {runs.sum().item():.6g}, the configured loss gives "
                       f"{want.sum().item():.6g} (center_rewards_coefficient={self.cfg.center_rewards_coefficient}, "
                       f"{with_margin}): the loss that runs is not the loss configured")
        if why:
            raise GateError("; ".join(why))
        return report

    def _margin_of(self, batch: Batch) -> Optional[torch.Tensor]:
        """The batch's pairs' margins read from the encoded pairs by their rows, not from the batch's own field
        (the gate's independent path: a batch that lost or misordered them fails it)."""
        if self.pairs.margin is None:
            return None
        return torch.as_tensor(self.pairs.margin[batch.pair_rows], dtype=torch.float64)

    def _alone_rewards(self, rows: np.ndarray) -> torch.Tensor:
        """Each sequence's reward from the class's own forward of it alone (pooled at transformers' rule);
        every rank runs as many forwards, repeating its first."""
        device = self._device()
        n = _max_count(self.env, len(rows), device)
        out = []
        for i in range(n):
            tokens = torch.as_tensor(self.pairs.row(int(rows[min(i, len(rows) - 1)]))[0], dtype=torch.long,
                                     device=device)
            r = self.forward({"input_ids": tokens[None], "use_cache": False}).float().reshape(-1)[0]
            if i < len(rows):
                out.append(r)
        return torch.stack(out)

    def describe(self) -> dict[str, Any]:
        data = self.pairs
        return {
            "kind": self.name, "loss": self.loss,
            "loss_definition": "per pair -logsigmoid(r_chosen - r_rejected) + center_rewards_coefficient x "
                               "(r_chosen + r_rejected)^2, averaged over pairs (TRL's RewardTrainer.compute_loss)",
            "center_rewards_coefficient": self.cfg.center_rewards_coefficient,
            "margin": self._describe_margin(),
            "head": head_record(self.model) if hasattr(self, "model") else None,
            "reference": {"resolved": None, "why_null": "a reward model reads no reference"},
            "data": {"pairs": data.pairs, "truncated_pairs": int(data.truncated.sum()),
                     "heldout_pairs": 0 if self.heldout is None else self.heldout.pairs,
                     "heldout_every": self.cfg.heldout_every() if self.heldout is not None else None},
            "gate": self.gate_report,
        }
