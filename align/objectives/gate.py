"""The preference objective's step-0 gate (align/objectives/dpo.py describes what it proves).

The "alone" path is deliberately independent of collation: it reads a sequence's tokens and loss
mask from the encoded records, forwards that one sequence with no mask and no position ids, and sums
log p(token[t+1] | tokens[:t+1]) over the targets. Batched and alone agree to float noise only when
the batch put every pair's sides, masks and positions where `seq_ids`, `chosen_seq` and
`rejected_seq` say; the tolerance is per target token, so a long sequence is not held to a tighter
bound than a short one.
"""

from __future__ import annotations

from typing import Any

import torch

from align.data.collate import Batch
from align.errors import ConfigError


class GateError(ConfigError):
    """The step-0 gate failed: the run would train against a wrong reference or wrong pairs (exit 2,
    like the mask gate: nothing has trained)."""

    def __init__(self, message: str) -> None:
        super().__init__("objective gate", message)


FP32_TOLERANCE = 1e-4
BF16_TOLERANCE = 5e-2


def _alone_logps(forward: Any, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    logits = forward({"input_ids": tokens[None], "use_cache": False}).float()[0]
    logp = torch.log_softmax(logits[:-1], dim=-1).gather(1, tokens[1:, None])[:, 0]
    return (logp * mask[1:].to(logp.dtype)).sum()


def _max_count(env: Any, n: int, device: torch.device) -> int:
    t = torch.tensor([n], device=device)
    if env is not None and env.distributed:
        import torch.distributed as dist

        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def alone_sequence_logps(obj: Any, pair_ids: list[int]) -> torch.Tensor:
    """[2 * len(pair_ids)] summed log-probs of each pair's chosen and rejected sequence, one forward
    each; every rank runs as many forwards (a sharded forward is collective), repeating its first."""
    data, device = obj.pairs, obj._device()
    seqs = [2 * p + side for p in pair_ids for side in (0, 1)]
    n = _max_count(obj.env, len(seqs), device)
    out = []
    for i in range(n):
        tokens, mask = data.row(seqs[min(i, len(seqs) - 1)])
        lp = _alone_logps(obj.forward, torch.as_tensor(tokens, dtype=torch.long, device=device),
                          torch.as_tensor(mask, device=device))
        if i < len(seqs):
            out.append(lp)
    return torch.stack(out)


def run_gate(obj: Any, batch: Batch) -> dict[str, Any]:
    model = obj.model
    was = model.training
    model.eval()  # dropout (LoRA's included) would make two forwards of the same tokens differ
    try:
        with torch.no_grad():
            seq = obj.sequence_logps(obj.forward, batch).float()
            counts = torch.bincount(batch.seq_ids[batch.seq_ids >= 0].reshape(-1), minlength=seq.numel()).clamp(min=1)
            alone = alone_sequence_logps(obj, [int(p) for p in batch.pair_rows]).float()
            rc, rr = obj.reference_logps(obj.forward, batch)
    finally:
        model.train(was)
    tol, ref_tol = tolerances(obj)
    order = torch.stack([batch.chosen_seq, batch.rejected_seq], 1).reshape(-1)
    batched = seq[order]
    per_token = ((batched - alone).abs() / counts[order]).max().item()
    report: dict[str, Any] = {"ran": True, "pairs": int(batch.pairs), "tolerance_per_token": tol,
                              "batching_max_abs_per_token": per_token, "batching_ok": per_token <= tol}
    if rc is None:
        report.update(reference_tolerance_per_token=None, reference_max_abs_per_token=None, reference_ok=None,
                      reference_why_null=f"loss={obj.loss.value} is reference-free: no log-ratio to check")
    else:
        ref = torch.stack([rc, rr], 1).reshape(-1).float()
        r = ((batched - ref).abs() / counts[order]).max().item()
        report.update(reference_tolerance_per_token=ref_tol, reference_max_abs_per_token=r, reference_ok=r <= ref_tol,
                      reference_why_null=None)
    failed = [k for k in ("batching_ok", "reference_ok") if report[k] is False]
    if failed:
        what = {"batching_ok": f"batched log-probs differ from each sequence alone by {per_token:.3g} nats/token "
                               f"> tolerance {tol:g} (mis-paired batch, misaligned mask or attention across packed "
                               "sequences)",
                "reference_ok": f"the policy differs from its reference at step 0 by "
                                f"{report['reference_max_abs_per_token']:.3g} nats/token > tolerance {ref_tol:g} "
                                "(wrong reference)"}
        raise GateError("; ".join(what[k] for k in failed))
    return report


def tolerances(obj: Any) -> tuple[float, float]:
    """(batching, reference) bounds per target token. `objective.gate_tolerance` sets both; by default
    each is that of the precision its log-probs are computed in: a frozen copy the user put in bf16
    (`objective.reference_dtype`) differs from an fp32 policy by bf16 rounding, not by being wrong."""
    if obj.cfg.gate_tolerance:
        return obj.cfg.gate_tolerance, obj.cfg.gate_tolerance
    batching = BF16_TOLERANCE if obj._autocast_dtype() == torch.bfloat16 else FP32_TOLERANCE
    return batching, BF16_TOLERANCE if _reference_below_policy(obj) else batching


def _reference_below_policy(obj: Any) -> bool:
    module = getattr(obj.reference, "module", None)
    if module is None:
        return False
    ref, policy = next(module.parameters()).dtype, next(obj.model.parameters()).dtype
    return torch.finfo(ref).bits < torch.finfo(policy).bits
