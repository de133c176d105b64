"""On-policy distillation (`objective=distill`; docs/objectives.md): the student, the model being
trained, samples completions of prompts with GRPO's engine and prompt stream (align/objectives/grpo_rollouts.py
makes the calls, align/objectives/rollout_engine.py builds the engine), and a frozen teacher
(`objective.teacher`, align/objectives/teacher.py) scores every sampled token with one forward over
prompt + completion. The loss at each completion token is a divergence between the two next-token
distributions over the full vocabulary (reverse KL, or TRL's generalised JSD at `beta`;
align/objectives/distill_loss.py), summed over the micro-batch's completion tokens, and the loop
divides by the window's: a per-token mean over the step's completions, never over a prompt token.

Each step draws a rollout (`prompts_per_rollout` prompts x `group_size` completions each, a seed
derived from the rollout index) and serves it over `updates_per_rollout` optimizer steps, as GRPO does.
Besides the loss a step's row has the student's and the teacher's mean log-prob of the sampled tokens
(`distill/student_logp`, `distill/teacher_logp`) and the trainer-vs-engine log-prob comparison
(`mismatch/*`, align/objectives/grpo_metrics.py); `time/reference_s` is the teacher's forwards.

The step-0 gate, before any update, on the first prompt batch (teacher-forced, every real position):
with the teacher's logits replaced by the student's own, the loss the run computes must be 0 with a
zero gradient; against the real teacher it must equal `reference_divergence`, the configured
divergence written from the probabilities, value and gradient. A loss of another direction, beta or
temperature than the one configured fails it.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch

from align.config import SamplerKind, TrainConfig
from align.config.distill_config import DistillConfig, DistillLoss
from align.data.collate import IGNORE, Batch
from align.errors import AlignError, ConfigError
from align.objectives import register
from align.objectives.distill_loss import chunked_divergence, head_logits, reference_divergence, token_divergence
from align.objectives.gate import GateError
from align.objectives.grpo_metrics import add_mismatch, time_row, window_row
from align.objectives.grpo_rollouts import RolloutMaker
from align.objectives.grpo_terms import GRPOTerms
from align.objectives.rollout import Rollout, RolloutBatch
from align.objectives.rollout_stats import Sums
from align.objectives.teacher import KEY, load_teacher, teacher_identity, teacher_params, teacher_problem
from align.objectives.views import distill_view
from align.parallel.env import DistEnv, autocast_context

GATE_TOLERANCE = 1e-5
"""The gate's bound per token (nats, relative to max(1, value)) between the loss and its recompute: both
read the same fp32 logits, so only summation order separates them."""


class DistillTerms(GRPOTerms):
    """GRPO's rollout terms, with the teacher's weights (its own parameter count, in the student's
    parameter dtype) in place of a KL reference."""

    def reference_bytes(self, cfg: Any, params: int, wbytes: int) -> int:
        return teacher_params(cfg.objective.teacher) * wbytes if cfg.objective.teacher else 0


@register
class Distill(RolloutMaker):
    name = "distill"
    terms = DistillTerms
    console_metrics = (("kl", "loss"), ("teacher logp", "distill/teacher_logp"),
                       ("logp mismatch", "mismatch/logp_abs_mean"))
    view = staticmethod(distill_view)

    @staticmethod
    def preflight(cfg: TrainConfig) -> str:
        """What was checked of the teacher (align/run/preflight_checks.py `check_objective`); ConfigError
        naming objective.teacher when it cannot distill into this run's student."""
        why, what = teacher_problem(cfg)
        if why:
            raise ConfigError(KEY, why, cfg.objective.teacher)
        return what

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg: DistillConfig = cfg.objective
        if self.cfg.teacher is None:
            raise ConfigError(KEY, "objective=distill needs a teacher: objective.teacher=<a local HF checkpoint dir>")
        self.train_cfg = cfg
        self.beta = 1.0 if self.cfg.loss == DistillLoss.reverse_kl else self.cfg.beta
        self.chunk = cfg.trainer.loss_chunk_tokens
        self._start_rollouts()
        self.teacher: Any = None
        self.teacher_id: Optional[dict[str, Any]] = None
        self.softcaps: tuple[Optional[float], Optional[float]] = (None, None)
        self.gate_report: Optional[dict[str, Any]] = None

    # ----------------------------------------------------------------------------- building

    def build_data(self, cfg: TrainConfig, tokenizer: Any, env: DistEnv):
        from align.data.prompts import NoReward, build_prompt_stream, load_prompts

        self.env, self.tokenizer = env, tokenizer
        self.prompts = load_prompts(cfg, tokenizer, NoReward())
        return self.prompts.data, build_prompt_stream(cfg, self.prompts, tokenizer.pad_token_id, env.rank, env.world)

    def prepare(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        self.teacher = load_teacher(self.train_cfg)
        self.teacher_id = teacher_identity(self.teacher, self.cfg.teacher)
        return [self.teacher]

    def bind(self, model: torch.nn.Module, forward: Callable[..., torch.Tensor], resuming: bool = False) -> None:
        from align.config.rules import require_auto_resolved
        from align.objectives.rollout_engine import build_rollout_engine

        for key in ("generation_dtype", "generation_batch_size"):  # resolved by the plan, as for objective=grpo
            require_auto_resolved(f"objective.{key}", getattr(self.cfg, key), "the distillation engine",
                                  "align.plan.budget_auto.plan_generation")
        self.model, self.forward = model, forward
        self.softcaps = tuple(getattr(m.config, "final_logit_softcapping", None) for m in (model, self.teacher))
        self.device = next(model.parameters()).device
        self.autocast: Callable[[], Any] = autocast_context(self.train_cfg.trainer.precision, self.device.type)
        # No router flip record: the update's forward is not compared with the generation's routing.
        self.engine, _, _ = build_rollout_engine(self.cfg, self.train_cfg, model, self.tokenizer, self.env,
                                                 record_routers=False)

    # ----------------------------------------------------------------------------- rollouts

    def _new_rollout(self, batches: Iterator[Batch], micro: int) -> None:
        weights = self._sync_engine()
        rows = np.asarray(next(batches).rows, dtype=np.int64)
        prompts, out, _ = self._generate(rows, 0)
        g = self.cfg.group_size
        seqs = [(int(rows[i // g]), i // g, prompts[i // g], o) for i, o in enumerate(out)]
        lens = [len(p) + o.num_tokens for _, _, p, o in seqs]
        zeros = np.zeros(len(seqs), dtype=np.float64)  # no reward: nothing weighs a completion but its tokens
        r = Rollout(
            index=self.rollouts,
            rows=np.array([s[0] for s in seqs], dtype=np.int64), group=np.array([s[1] for s in seqs], dtype=np.int64),
            prompt_lens=np.array([len(s[2]) for s in seqs], dtype=np.int64),
            tokens=np.concatenate([np.asarray(list(p) + list(o.token_ids), dtype=np.int32) for _, _, p, o in seqs]),
            offsets=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
            engine_logps=np.concatenate([np.asarray(o.logprobs, dtype=np.float32) for *_, o in seqs]),
            sampler_logps=np.concatenate([np.asarray(o.sampler_logprobs, dtype=np.float32) for *_, o in seqs]),
            rewards=zeros, advantages=zeros.copy(),
            stopped=np.array([o.finish_reason.value == "stop" for *_, o in seqs]))
        if self.train_cfg.sampler.kind == SamplerKind.budget:
            r.cut_budget(self.cfg.updates_per_rollout, self.train_cfg.sampler, self._agree_counts)
        else:
            r.cut(self.cfg.updates_per_rollout, micro)
        r.meta = {"weights_sha256": weights}
        self.rollout, self.rollouts = r, self.rollouts + 1
        self._data = r.dataset()
        for key, v in (("d_seqs", r.size), ("ro_tokens", r.completion_lens.sum()), ("d_stopped", r.stopped.sum())):
            self._sums.add(key, float(v))
        self._row.update({"rollout/index": r.index, "rollout/weights_sha256": weights})

    def _agree_counts(self, counts: list[int]) -> list[int]:
        if self.env is None or not self.env.distributed:
            return counts
        return [int(c) for c in self.env.all_reduce_max(torch.tensor(counts, device=self.device)).tolist()]

    def next_window(self, batches: Iterator[Batch], n: int, device: torch.device) -> list[Batch]:
        self._t_window = time.perf_counter()
        self._timers = {}
        if self.rollout is None or self.rollout.served >= len(self.rollout.parts):
            self._new_rollout(batches, n)
        r = self.rollout
        part = r.parts[r.served]
        why = r.misfit(part, n, self.train_cfg.sampler)
        if why:
            raise AlignError(f"rollout {r.index}'s step {r.served + 1} {why}")
        r.served += 1
        return [self._batch(seqs, with_old=False).to(device) for seqs in part]

    # ---------------------------------------------------------------------------------- loss

    def weight(self, batch: Batch) -> int:
        return batch.loss_tokens

    def loss_args(self) -> dict[str, float]:
        """The configured divergence's arguments: what `micro_loss` and the gate both pass."""
        return {"beta": self.beta, "temperature": self.cfg.temperature}

    def hidden_at(self, forward: Callable, inputs: dict, keep: torch.Tensor,
                  module: Optional[torch.nn.Module] = None) -> torch.Tensor:
        """Final hidden states of the student (or `module`) at the flat positions `keep`."""
        out = forward(inputs, hidden_only=True, module=module)
        return out.reshape(-1, out.shape[-1]).index_select(0, keep)

    def micro_loss(self, forward: Callable[..., torch.Tensor], batch: Batch) -> torch.Tensor:
        assert isinstance(batch, RolloutBatch), type(batch)
        y = batch.labels.reshape(-1)
        keep = torch.nonzero(y != IGNORE).squeeze(1)
        student = self.hidden_at(forward, batch.model_inputs(), keep)
        t0 = time.perf_counter()
        with torch.no_grad():
            teacher = self.hidden_at(forward, batch.model_inputs(), keep, module=self.teacher)
        self._timed("reference_s", t0)
        s_head, t_head = self.model.get_output_embeddings(), self.teacher.get_output_embeddings()
        div, s_lp, t_lp = chunked_divergence(student, s_head.weight, teacher, t_head.weight, *self.softcaps,
                                             chunk=self.chunk, targets=y.index_select(0, keep),
                                             **self.loss_args()).unbind(-1)
        add_mismatch(self._sums, s_lp, batch.engine_logps, batch.sampler_logps, float("inf"))
        for key, v in (("d_div", div), ("d_student", s_lp), ("d_teacher", t_lp)):
            self._sums.add(key, v.detach().sum())
        self._sums.add("d_tokens", div.numel())
        self._sums.add("update_tokens", batch.tokens)
        return div.sum()

    def window_metrics(self) -> dict[str, Any]:
        sums, hi, lo = self._sums.reduce(self.env, self.device)
        row = dict(self._row)
        row.update(window_row(sums, hi, lo))
        total = time.perf_counter() - self._t_window if self._t_window is not None else 0.0
        row.update(time_row(sums, self._timers, total))
        if sums.get("d_tokens"):
            n = sums["d_tokens"]
            row.update({"distill/divergence": sums["d_div"] / n, "distill/student_logp": sums["d_student"] / n,
                        "distill/teacher_logp": sums["d_teacher"] / n})
        if sums.get("d_seqs"):
            n = sums["d_seqs"]
            row.update({"rollout/sequences": int(n), "rollout/tokens": int(sums["ro_tokens"]),
                        "rollout/completion_len_mean": sums["ro_tokens"] / n,
                        "rollout/stop_frac": sums["d_stopped"] / n})
        self._sums, self._row = Sums(), {}
        return row

    # ---------------------------------------------------------------------------------- gate

    def gate(self, batch: Batch) -> dict[str, Any]:
        """The module doc's checks on `batch` (the first prompt batch), teacher-forced at every real position."""
        keep = torch.nonzero(batch.padding_mask.reshape(-1) if batch.padding_mask is not None
                             else torch.ones(batch.input_ids.numel(), dtype=torch.bool,
                                             device=batch.input_ids.device)).squeeze(1)
        was = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                s = self.hidden_at(self.forward, batch.model_inputs(), keep)
                t = self.hidden_at(self.forward, batch.model_inputs(), keep, module=self.teacher)
                s = head_logits(s, self.model.get_output_embeddings().weight, self.softcaps[0]).float()
                t = head_logits(t, self.teacher.get_output_embeddings().weight, self.softcaps[1]).float()
        finally:
            self.model.train(was)
        self.gate_report = report = gate_check(s, t, self.loss_args(), self.cfg)
        if not report["ok"]:
            raise GateError(report["why"])
        return report

    # ------------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {"rollouts": self.rollouts, "teacher_weights_sha256": (self.teacher_id or {}).get("weights_sha256")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = self.state_dict()["teacher_weights_sha256"]
        if state.get("teacher_weights_sha256") != mine:
            raise ConfigError(KEY, f"the checkpoint was distilled from a teacher of weights sha256 "
                              f"{state.get('teacher_weights_sha256')}, this run's is {mine}: resume with the run's "
                              "own teacher", self.cfg.teacher)
        self.rollouts = int(state["rollouts"])

    def rank_state_dict(self) -> dict[str, Any]:
        return {"rollout": None if self.rollout is None else self.rollout.state_dict()}

    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        d = state.get("rollout")
        self.rollout = None if d is None else Rollout.from_state_dict(d)
        if self.rollout is not None:
            self._data = self.rollout.dataset()

    def describe(self) -> dict[str, Any]:
        c = self.cfg
        loss = {"kind": "distill", "loss": c.loss.value, "beta": self.beta, "temperature": c.temperature,
                "definition": "TRL 1.16 GKDTrainer.generalized_jsd_loss per completion token, summed over the "
                              "vocabulary; batchmean over the step's completion tokens",
                "teacher": self.teacher_id,
                "sampling": {"group_size": c.group_size, "prompts_per_rollout": c.prompts_per_rollout,
                             "updates_per_rollout": c.updates_per_rollout, "max_new_tokens": c.max_new_tokens,
                             "temperature": c.temperature, "top_p": c.top_p,
                             "seed": "sha256(trainer.seed/rollout index/rank/round)"},
                "logits": {"chunk_tokens": self.chunk or None, "final_logit_softcapping": list(self.softcaps)},
                "engine": self.engine.describe() if self.engine is not None else None,
                "generation_dtype": c.generation_dtype.value, "gate": self.gate_report}
        return {"kind": self.name, "loss": loss, "prompts": len(self.prompts)}


def gate_check(s: torch.Tensor, t: torch.Tensor, args: dict[str, float], cfg: DistillConfig) -> dict[str, Any]:
    """[N, V] student and teacher logits -> the gate's report: the loss that runs (`token_divergence` with
    `args`) at teacher = student (0, gradient 0) and against the teacher (its value and gradient equal to
    `reference_divergence` of the configured loss: beta 1 for reverse_kl, `objective.beta` for jsd)."""
    beta = 1.0 if cfg.loss == DistillLoss.reverse_kl else cfg.beta
    x = s.detach().clone().requires_grad_()
    self_loss = token_divergence(x, s.detach(), **args)
    self_grad = torch.autograd.grad(self_loss.sum(), x)[0].abs().max().item()
    x = s.detach().clone().requires_grad_()
    ran = token_divergence(x, t, **args)
    grad = torch.autograd.grad(ran.sum(), x)[0]
    xd = s.detach().double().requires_grad_()
    want = reference_divergence(xd, t.double(), beta, cfg.temperature)
    want_grad = torch.autograd.grad(want.sum(), xd)[0]
    err = ((ran.detach().double() - want.detach()).abs() / want.detach().abs().clamp(min=1)).max().item()
    grad_err = (grad.double() - want_grad).abs().max().item()
    self_max = self_loss.detach().abs().max().item()
    ok = self_max <= GATE_TOLERANCE and self_grad <= GATE_TOLERANCE and err <= GATE_TOLERANCE \
        and grad_err <= GATE_TOLERANCE
    why = None if ok else (
        f"the loss that runs is not the loss configured: at teacher = student it is {self_max:.3g} per token with a "
        f"gradient of {self_grad:.3g} (0 and 0 expected); against the teacher it is off by {err:.3g} per token and "
        f"its gradient by {grad_err:.3g} from objective.loss={cfg.loss.value} (beta={beta}, temperature="
        f"{cfg.temperature}) recomputed from the logits")
    return {"positions": int(s.shape[0]), "loss_at_teacher_eq_student_max": self_max, "grad_at_self_max": self_grad,
            "loss_mean": ran.detach().mean().item(), "loss_max_rel_error": err, "grad_max_abs_error": grad_err,
            "ok": ok, "why": why}
