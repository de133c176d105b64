"""Direct preference optimisation and its family (`objective=dpo`, `objective.loss=...`).

A micro-batch holds whole pairs (align/data/preference.py): sequence 2p is pair p's prompt+chosen,
2p+1 its prompt+rejected, and `seq_ids` names the sequence of every target position, packed or
padded. One forward gives every sequence's summed log-prob (align/objectives/logps.py); the
reference's come from the strategy `objective.reference` resolved to (align/objectives/reference.py);
the per-pair losses (align/objectives/preference_losses.py) are summed, and the loop divides by the
window's global pair count.

The step-0 gate (`gate`), before any update, on the first micro-batch this rank trains on:
- batching: every pair's batched log-probs equal those of its two sequences forwarded ALONE, from
  the encoded records, by an independent path. A mis-paired batch, a misaligned mask or packed
  sequences attending to each other breaks it;
- reference: the policy equals its reference, so the log-ratio is 0 on every pair. A wrong reference
  (other weights, adapters left on, a stale cache) breaks it. Reference-free losses have none: the
  manifest says so.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch

from align.config import DPOConfig, ReferenceKind, TrainConfig
from align.data.collate import Batch
from align.errors import ConfigError
from align.objectives import register
from align.objectives.gate import GateError, run_gate  # noqa: F401  (GateError: raised by the gate)
from align.objectives.logps import sequence_sums, sequence_token_counts, token_logps
from align.objectives.plan_terms import PlanTerms, frozen_copy
from align.objectives.preference_losses import PairLogps, preference_loss
from align.objectives.preference_spec import PreferenceLoss
from align.objectives.reference import (
    AdaptersOff,
    Precomputed,
    cache_key,
    load_table,
    model_config_meaning,
    preference_reference,
    preference_reference_why,
    prepare_reference,
    save_table,
)
from align.objectives.views import pair_view
from align.parallel.env import DistEnv, autocast_dtype
from align.telemetry.progress import Phase

log = logging.getLogger("align")



class DPOTerms(PlanTerms):
    """DPO: pairs through the sampler, two sequences each; a frozen copy where the reference is the model."""

    sequences_per_row = 2

    def reference_bytes(self, cfg: Any, params: int, wbytes: int) -> int:
        """DPO's `auto` is counted as the copy: whether it precomputes depends on the planned pair stream."""
        return frozen_copy(cfg, params, wbytes) if preference_reference(cfg) == ReferenceKind.model else 0


@register
class DPO:
    name = "dpo"
    terms = DPOTerms
    console_metrics = (("loss", "loss"), ("reward acc", "rewards/accuracy"), ("margin", "rewards/margin"))
    view = staticmethod(pair_view)

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg: DPOConfig = cfg.objective
        self.train_cfg = cfg
        self.loss = PreferenceLoss(cfg.objective.loss)
        self.reference_kind, self.reference_why = preference_reference_why(cfg)
        self.chunk = cfg.trainer.loss_chunk_tokens
        self.env: Optional[DistEnv] = None
        self.reference: Any = None
        self.reference_sha256: Optional[str] = None
        self.resumed_at = False
        self.softcap: Optional[float] = None
        self.gate_report: Optional[dict[str, Any]] = None
        self._sums: dict[str, torch.Tensor] = {}
        self._pairs = 0

    # ----------------------------------------------------------------------------- building

    def load_data(self, cfg: TrainConfig, tokenizer: Any):
        """The encoded pairs (an objective on this layout, e.g. KTO's examples, loads its own)."""
        from align.data.preference import load_pairs

        return load_pairs(cfg, tokenizer)

    def build_data(self, cfg: TrainConfig, tokenizer: Any, env: DistEnv):
        from align.data.pairs import build_pair_stream

        self.env, self.pad_id = env, tokenizer.pad_token_id
        self.pairs = self.load_data(cfg, tokenizer)
        stream = build_pair_stream(cfg, self.pairs, tokenizer.pad_token_id, env.rank, env.world,
                                   pin_memory=env.device.type == "cuda")
        # auto picks precomputed from one epoch on: known only now that the stream is planned. The plan
        # already counted epoch 0's micro-batches (align.data.stats.plan_stats): no second pass over them.
        plan = stream.sampler.plan
        per_epoch = (plan["micro_batches"] - plan["dropped_by_rank_trim"]) // env.world
        epochs = cfg.trainer.epochs or cfg.trainer.max_steps * cfg.trainer.grad_accum / per_epoch
        self.reference_kind, self.reference_why = preference_reference_why(cfg, epochs)
        return self.pairs, stream

    def prepare(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """Before placement: the reference's identity from the unsharded starting weights, and for
        reference=model the frozen copy, which the trainer places and shards like the policy."""
        self.reference_sha256, frozen = prepare_reference(model, self.reference_kind, self.cfg.reference_dtype)
        if frozen is None:
            return []
        self.reference = frozen
        return [frozen.module]

    def bind(self, model: torch.nn.Module, forward: Callable[..., torch.Tensor], resuming: bool = False) -> None:
        self.model, self.forward = model, forward
        self.resumed_at = resuming
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        if self.reference_kind == ReferenceKind.adapters_off:
            self.reference = AdaptersOff(model)
        elif self.reference_kind == ReferenceKind.precomputed:
            self.reference = self._precomputed()

    # -------------------------------------------------------------------------------- loss

    def sequence_logps(self, forward: Callable, batch: Batch, module: Optional[torch.nn.Module] = None) -> torch.Tensor:
        """Summed log-prob of every sequence of `batch` ([2 * pairs], fp32) under `module` (the policy)."""
        hidden_only = bool(self.chunk)
        out = forward(batch.model_inputs(), hidden_only=hidden_only, module=module)
        head = (module or self.model).get_output_embeddings() if hidden_only else None
        values, keep = token_logps(out, batch.labels, head, self.chunk, self.softcap)
        return sequence_sums(values, keep, batch.seq_ids, 2 * batch.pairs)

    def reference_logps(self, forward: Callable, batch: Batch) -> tuple[torch.Tensor, torch.Tensor] | tuple[None, None]:
        if self.reference is None:
            return None, None
        if isinstance(self.reference, Precomputed):
            return self.reference.pair_logps(torch.as_tensor(batch.pair_rows))
        seq = self.reference.sequence_logps(forward, self.sequence_logps, batch)
        return seq[batch.chosen_seq], seq[batch.rejected_seq]

    def pair_logps(self, forward: Callable, batch: Batch) -> PairLogps:
        seq = self.sequence_logps(forward, batch)
        counts = sequence_token_counts(batch.seq_ids, 2 * batch.pairs)
        rc, rr = self.reference_logps(forward, batch)
        pc, pr = seq[batch.chosen_seq], seq[batch.rejected_seq]
        nc, nr = counts[batch.chosen_seq], counts[batch.rejected_seq]
        orpo = self.loss == PreferenceLoss.orpo
        return PairLogps(policy_chosen=pc, policy_rejected=pr, chosen_tokens=nc, rejected_tokens=nr,
                         reference_chosen=rc, reference_rejected=rr,
                         chosen_nll=-pc if orpo else None, chosen_nll_tokens=nc if orpo else None)

    def next_window(self, batches: Iterator[Batch], n: int, device: torch.device) -> list[Batch]:
        return [next(batches).to(device) for _ in range(n)]

    def weight(self, batch: Batch) -> int:
        return batch.pairs

    def micro_loss(self, forward: Callable[..., torch.Tensor], batch: Batch) -> torch.Tensor:
        out = preference_loss(self.loss, self.pair_logps(forward, batch), beta=self.cfg.beta,
                              label_smoothing=self.cfg.label_smoothing, simpo_gamma=self.cfg.simpo_gamma)
        return self._accumulate(out, batch)

    def _accumulate(self, out: Any, batch: Batch) -> torch.Tensor:
        """Add a micro-batch's metric sums to the window's; the summed loss it returns is the step's."""
        truncated = torch.as_tensor(self.pairs.truncated[batch.pair_rows], device=out.losses.device)
        for k, v in out.metric_sums(truncated).items():
            if k != "loss":  # the loop logs the loss itself
                self._sums[k] = self._sums.get(k, 0) + v
        self._pairs += batch.pairs
        return out.losses.sum()

    def _window_sums(self) -> Optional[tuple[dict[str, float], float]]:
        """The window's metric sums and its pair count, summed over ranks, then reset; None if empty."""
        if not self._sums:
            return None
        names = sorted(self._sums)
        device = self._sums[names[0]].device
        vec = torch.stack([torch.as_tensor(self._sums[k], device=device, dtype=torch.float32) for k in names]
                          + [torch.tensor(float(self._pairs), device=device)])
        if self.env is not None and self.env.distributed:
            self.env.all_reduce_sum(vec)
        values = vec.tolist()
        self._sums, self._pairs = {}, 0
        return dict(zip(names, values[:-1])), values[-1]

    def window_metrics(self) -> dict[str, Any]:
        window = self._window_sums()
        if window is None:
            return {}
        sums, n = window
        return {"pairs": int(n), **{k: v / max(n, 1.0) for k, v in sums.items()}}

    # ------------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        ref = self.reference
        return {"reference": None if self.reference_kind is None else self.reference_kind.value,
                "reference_sha256": self.reference_sha256,
                "reference_cache_key": ref.key if isinstance(ref, Precomputed) else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resume must train against the reference the run started with."""
        mine = self.state_dict()
        for k in ("reference", "reference_sha256", "reference_cache_key"):
            if state.get(k) != mine[k]:
                raise ConfigError(f"objective.{k}", f"the checkpoint was trained against {state.get(k)!r}, "
                                  f"this run resolves {mine[k]!r}: resume with the run's own reference", mine[k])

    def rank_state_dict(self) -> dict[str, Any]:
        return {}  # every rank's position is the stream's

    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        pass

    # --------------------------------------------------------------------------- precomputed

    def _precomputed(self) -> Precomputed:
        key = self.reference_cache_key()
        path = self._cache_root() / f"{key}.npy"
        table = load_table(path, self.pairs.pairs)
        hit = table is not None
        if table is None:
            if self.resumed_at:
                raise ConfigError("objective.reference", f"precomputed reference {key} is missing and the policy has "
                                  "trained since: it cannot be recomputed from this run", "precomputed")
            table = self._compute_table(self._all_pairs())
            if self.env is None or self.env.is_main:
                save_table(path, table)
        log.info("reference: precomputed %s (%s)", key, "cache hit" if hit else "computed")
        return Precomputed(table.to(self._device()), key, hit, path)

    def reference_cache_key(self) -> str:
        """What the precomputed log-probs mean: the reference's weights and config (its logit softcap
        too), the encoded pairs (their encode key covers sources, tokenizer, template, max_seq_len,
        truncation: the masks), how the loss reads the tokens (precision, chunked head) and sums them."""
        parts = {"reference_sha256": self.reference_sha256, "model_config": model_config_meaning(self.model),
                 "encode_cache_key": self.pairs.meta.get("encode_cache_key"),
                 "chat_template_sha256": self.pairs.meta.get("chat_template_sha256"),
                 "pairing": self.pairs.meta.get("pairing_version"), "pairs": self.pairs.pairs,
                 "precision": str(self._autocast_dtype()), "chunk": bool(self.chunk),
                 "logps": "sum over completion target tokens, fp32 accumulation"}
        return cache_key(parts)

    def _all_pairs(self, per_batch: int = 8) -> Iterator[Batch]:
        """Every pair once, in order, `per_batch` pairs per padded micro-batch."""
        from align.data.pairs import collate_pairs, sequence_rows

        pad = self.train_cfg.sampler.pad_to_multiple_of
        for start in range(0, self.pairs.pairs, per_batch):
            ids = np.arange(start, min(start + per_batch, self.pairs.pairs))
            yield collate_pairs(self.pairs, sequence_rows(ids), self.pad_id, pad)

    def _compute_table(self, batches: Iterator[Batch]) -> torch.Tensor:
        """Every pair's (chosen, rejected) summed log-probs under the starting policy; every rank
        forwards the same batches in the same order (a sharded forward is collective)."""
        table = torch.zeros(self.pairs.pairs, 2, dtype=torch.float32)
        was = self.model.training
        self.model.eval()
        main = self.env is None or self.env.is_main
        with torch.no_grad(), Phase("reference log-probs (pairs)", self.pairs.pairs, enabled=main) as phase:
            for b in batches:
                phase.advance(len(b.pair_rows))
                b = b.to(self._device())
                seq = self.sequence_logps(self.forward, b).cpu()
                ids = torch.as_tensor(b.pair_rows)
                table[ids, 0], table[ids, 1] = seq[b.chosen_seq.cpu()], seq[b.rejected_seq.cpu()]
        self.model.train(was)
        return table

    def _cache_root(self) -> Path:
        """Beside the encode cache (its directory's parent): `<parent>/reference/<key>.npy`."""
        from align.data.encode_cache import encode_dir

        return encode_dir(self.train_cfg.data).parent / "reference"

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _autocast_dtype(self) -> Optional[torch.dtype]:
        """The compute dtype of the trainer's forward (align/parallel/env.py's rule). Not
        torch.get_autocast_dtype: that is the device's default (float16 on CUDA), autocast or not."""
        return autocast_dtype(self.train_cfg.trainer.precision, self._device().type)

    # ---------------------------------------------------------------------------------- gate

    def gate(self, batch: Batch) -> dict[str, Any]:
        """Run the step-0 checks on `batch` (this rank's first micro-batch) and return the report;
        raises GateError when one fails. Skipped on a resume (the policy has moved on)."""
        if self.resumed_at:
            self.gate_report = {"ran": False, "why": "resumed: the policy has trained since step 0"}
            return self.gate_report
        self.gate_report = run_gate(self, batch)
        return self.gate_report

    def _reference_source(self, free_why: str) -> dict[str, Any]:
        """Where the reference's weights come from: the starting policy's checkpoint (for adapters_off,
        its base), or null for a random init, whose identity is the weights hash alone."""
        m = self.train_cfg.model
        if self.reference_kind is None:
            return {"path": None, "path_why_null": free_why}
        if m.pretrained:
            return {"path": m.pretrained, "path_why_null": None}
        return {"path": None, "path_why_null": f"random init (model.preset={m.preset.value}, "
                                               f"trainer.seed={self.train_cfg.trainer.seed}): no checkpoint path"}

    def describe(self) -> dict[str, Any]:
        free_why = f"loss={self.loss.value} is reference-free"
        return {
            "kind": self.name, "loss": self.loss.value, "beta": self.cfg.beta,
            "label_smoothing": self.cfg.label_smoothing, "simpo_gamma": self.cfg.simpo_gamma,
            "logps": {"chunk_tokens": self.chunk or None, "final_logit_softcapping": self.softcap},
            "reference": self._describe_reference(free_why),
            "data": {"pairs": self.pairs.pairs, "truncated_pairs": int(self.pairs.truncated.sum())},
            "gate": self.gate_report,
        }

    def _describe_reference(self, free_why: str) -> dict[str, Any]:
        ref = self.reference
        return {
            "requested": self.cfg.reference.value,
            "resolved": None if self.reference_kind is None else self.reference_kind.value,
            "why": self.reference_why,
            "why_null": free_why if self.reference_kind is None else None,
            **self._reference_source(free_why),
            "weights_sha256": self.reference_sha256,
            "dtype": self.cfg.reference_dtype.value if self.reference_kind == ReferenceKind.model else None,
            "cache_key": ref.key if isinstance(ref, Precomputed) else None,
            "cache_hit": ref.hit if isinstance(ref, Precomputed) else None,
            "cache_path": str(ref.path) if isinstance(ref, Precomputed) else None,
        }
