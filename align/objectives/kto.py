"""Kahneman-Tversky optimisation (`objective=kto`) on unpaired examples, on DPO's machinery.

A micro-batch holds whole examples (align/data/unpaired.py): sequence 2e is example e's prompt +
completion, 2e + 1 its KL sequence (its prompt with another example's completion). Everything DPO does
with a pair's two sequences it does here with an example's: one forward gives every sequence's summed
log-prob (align/objectives/logps.py), the reference's come from the strategy `objective.reference`
resolved to (align/objectives/reference.py, a precomputed table's columns being the completion and the
KL sequence), the per-example losses (align/objectives/kto_loss.py) are summed, and the loop divides by
the window's global example count.

The step-0 gate, before any update, on the first micro-batch this rank trains on: DPO's two checks
(align/objectives/gate.py: batched log-probs equal each sequence's alone, the policy equals its
reference) over both sequences of every example, and the loss's own: with the policy set to its
reference (every log-ratio and the KL reference point 0), the loss the run computes on the batch's
labels must be desirable_weight / 2 per desirable and undesirable_weight / 2 per undesirable example,
its gradient -beta x desirable_weight / 4 on a desirable completion's log-prob and +beta x
undesirable_weight / 4 on an undesirable one's, and none on the KL sequences'; then, with the KL
sequences' log-ratios moved to 1 / beta, desirable_weight x sigmoid(1) and undesirable_weight x
sigmoid(-1) under loss=kto (its point follows them) and the halves again under apo_zero_unpaired (it
reads no point). A loss that ignores beta, a weight, the labels or the KL point (or, under
apo_zero_unpaired, reads it), or that lets the gradient through the KL point, fails it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch

from align.config import TrainConfig
from align.config.kto_config import KTOConfig, KTOLoss
from align.data.collate import Batch
from align.objectives import register
from align.objectives.dpo import DPO, DPOTerms
from align.objectives.gate import GateError, run_gate
from align.objectives.kto_loss import KTOLogps, KTOLossOutput, kl_reference_point, kto_loss
from align.objectives.reference import preference_reference_why
from align.objectives.views import example_view

LOSS_DEFINITIONS = {
    KTOLoss.kto: "desirable: desirable_weight x (1 - sigmoid(beta (r - z))), undesirable: undesirable_weight x "
                 "(1 - sigmoid(beta (z - r))), r the completion's log-ratio, z the KL point (TRL's loss_type kto)",
    KTOLoss.apo_zero_unpaired: "desirable: desirable_weight x (1 - sigmoid(beta r)), undesirable: undesirable_weight "
                               "x sigmoid(beta r), r the completion's log-ratio (TRL's loss_type apo_zero_unpaired)"}
KL_POINT = {KTOLoss.kto: "kto's reference point follows the KL sequences",
            KTOLoss.apo_zero_unpaired: "apo_zero_unpaired reads no KL point"}


class KTOTerms(DPOTerms):
    """KTO: examples through the sampler, two sequences each (the completion and its KL sequence)."""


@register
class KTO(DPO):
    name = "kto"
    terms = KTOTerms
    console_metrics = (("loss", "loss"), ("kl", "kl"), ("margin", "rewards/margin"))
    view = staticmethod(example_view)

    def __init__(self, cfg: TrainConfig) -> None:  # DPO's state, without its pair losses
        self.cfg: KTOConfig = cfg.objective
        self.train_cfg = cfg
        self.loss = cfg.objective.loss.value
        self.reference_kind, self.reference_why = preference_reference_why(cfg)
        self.chunk = cfg.trainer.loss_chunk_tokens
        self.env = None
        self.reference: Any = None
        self.reference_sha256: Optional[str] = None
        self.resumed_at = False
        self.softcap: Optional[float] = None
        self.gate_report: Optional[dict[str, Any]] = None
        self._sums: dict[str, torch.Tensor] = {}
        self._pairs = 0

    def load_data(self, cfg: TrainConfig, tokenizer: Any):
        from align.data.unpaired import load_examples_encoded

        return load_examples_encoded(cfg, tokenizer)

    # -------------------------------------------------------------------------------- loss

    def logps(self, forward: Callable, batch: Batch) -> KTOLogps:
        """Every example's summed log-probs of its completion and its KL sequence, policy and reference."""
        seq = self.sequence_logps(forward, batch)
        ref, ref_kl = self.reference_logps(forward, batch)
        labels = torch.as_tensor(self.pairs.labels[batch.pair_rows], device=seq.device)
        return KTOLogps(policy=seq[batch.chosen_seq], reference=ref, policy_kl=seq[batch.rejected_seq],
                        reference_kl=ref_kl, desirable=labels)

    def loss_of(self, x: KTOLogps, reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> KTOLossOutput:
        """The configured loss of one micro-batch's log-probs: what `micro_loss` and the gate both run."""
        kl = kl_reference_point(x.policy_kl, x.reference_kl, reduce)
        return kto_loss(x, kl, beta=self.cfg.beta, desirable_weight=self.cfg.desirable_weight,
                        undesirable_weight=self.cfg.undesirable_weight, loss=self.cfg.loss.value)

    def _mean_over_ranks(self, kl: torch.Tensor) -> torch.Tensor:
        """TRL's gather of the per-process KL means, then their mean (align/objectives/kto_loss.py)."""
        if self.env is None or not self.env.distributed:
            return kl
        t = kl.reshape(1).clone()
        self.env.all_reduce_sum(t)
        return t[0] / self.env.world

    def micro_loss(self, forward: Callable[..., torch.Tensor], batch: Batch) -> torch.Tensor:
        return self._accumulate(self.loss_of(self.logps(forward, batch), self._mean_over_ranks), batch)

    def window_metrics(self) -> dict[str, Any]:
        window = self._window_sums()
        if window is None:
            return {}
        s, n = window
        out = {"examples": int(n), "kl": s["kl"] / max(s["n/kl"], 1.0),
               "desirable_fraction": s["n/chosen"] / max(n, 1.0),
               "truncated_fraction": s["truncated_fraction"] / max(n, 1.0)}
        for side in ("chosen", "rejected"):  # as TRL: a side no example of the window has is not logged
            if s[f"n/{side}"]:
                out[f"rewards/{side}"] = s[f"rewards/{side}"] / s[f"n/{side}"]
                out[f"logps/{side}"] = s[f"logps/{side}"] / s[f"n/{side}"]
        if "rewards/chosen" in out and "rewards/rejected" in out:
            out["rewards/margin"] = out["rewards/chosen"] - out["rewards/rejected"]
        return out

    # ---------------------------------------------------------------------------------- gate

    def gate(self, batch: Batch) -> dict[str, Any]:
        if self.resumed_at:
            return super().gate(batch)
        report = run_gate(self, batch)
        report.update(self._loss_check(batch))
        self.gate_report = report
        if not report["loss_ok"]:
            raise GateError(report["loss_why"])
        return report

    def _loss_check(self, batch: Batch) -> dict[str, Any]:
        """The loss at policy = reference on this batch's labels (module doc), through `loss_of`."""
        was = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                x = self.logps(self.forward, batch)
        finally:
            self.model.train(was)
        at_ref = x.reference.detach().float().clone().requires_grad_()
        at_ref_kl = x.reference_kl.detach().float().clone().requires_grad_()
        x = dataclasses.replace(x, policy=at_ref, reference=x.reference.float(), policy_kl=at_ref_kl,
                                reference_kl=x.reference_kl.float())
        loss = self.loss_of(x).losses.sum()
        grad, grad_kl = torch.autograd.grad(loss, [at_ref, at_ref_kl], allow_unused=True)
        c = self.cfg
        d = x.desirable
        want = (torch.where(d, c.desirable_weight, c.undesirable_weight) / 2).sum()
        want_grad = torch.where(d, -c.beta * c.desirable_weight / 4, c.beta * c.undesirable_weight / 4)
        loss_err = abs(loss.item() - want.item())
        grad_err = (grad - want_grad).abs().max().item()
        kl_grad = 0.0 if grad_kl is None else grad_kl.abs().max().item()
        # The KL sequences moved by 1 / beta: kto's point follows them (beta z = 1), apo_zero_unpaired's stays 0.
        shifted = self.loss_of(dataclasses.replace(x, policy_kl=x.reference_kl + 1 / c.beta)).losses.sum().item()
        z = 1.0 if c.loss == KTOLoss.kto else 0.0
        want_shifted = (torch.where(d, c.desirable_weight * torch.sigmoid(torch.tensor(z)),
                                    c.undesirable_weight * torch.sigmoid(torch.tensor(-z)))).sum().item()
        shifted_err = abs(shifted - want_shifted)
        tol = 1e-5 * max(1.0, want.item())
        ok = loss_err <= tol and grad_err <= tol and kl_grad == 0.0 and shifted_err <= tol
        return {"loss": c.loss.value, "loss_at_reference": loss.item(), "loss_expected": want.item(),
                "loss_grad_max_abs_error": grad_err, "loss_kl_grad_max_abs": kl_grad,
                "loss_kl_shifted": shifted, "loss_kl_shifted_expected": want_shifted, "loss_ok": ok,
                "loss_why": None if ok else (
                    f"the loss at policy = reference is {loss.item():.6g} with its gradient off by {grad_err:.3g} "
                    f"and {kl_grad:.3g} through the KL point, and {shifted:.6g} with the KL sequences' log-ratios "
                    f"at 1 / beta; {c.loss.value} with beta={c.beta}, desirable_weight={c.desirable_weight}, "
                    f"undesirable_weight={c.undesirable_weight} on this batch's {int(d.sum())} desirable and "
                    f"{int((~d).sum())} undesirable examples gives {want.item():.6g}, a gradient of -beta x "
                    f"desirable_weight / 4 and +beta x undesirable_weight / 4, none through the KL point, and "
                    f"{want_shifted:.6g} ({KL_POINT[c.loss]}) (the loss that runs is not the loss configured)")}

    def describe(self) -> dict[str, Any]:
        data = self.pairs
        return {
            "kind": self.name, "loss": self.loss, "beta": self.cfg.beta,
            "desirable_weight": self.cfg.desirable_weight, "undesirable_weight": self.cfg.undesirable_weight,
            "loss_definition": LOSS_DEFINITIONS[self.cfg.loss],
            "kl": {"estimate": "mean over each micro-batch's KL sequences (another example's completion) of "
                               "policy - reference summed log-probs, averaged over ranks, clamped at 0, no gradient",
                   "in_loss": self.cfg.loss == KTOLoss.kto,
                   "kl_sequences_truncated": data.stats.get("kl_truncated")},
            "logps": {"chunk_tokens": self.chunk or None, "final_logit_softcapping": self.softcap},
            "reference": self._describe_reference("kto always reads a reference"),
            "data": {"examples": data.pairs, "desirable": int(data.labels.sum()),
                     "undesirable": int((~data.labels).sum()), "truncated_examples": int(data.truncated.sum())},
            "gate": self.gate_report,
        }
