"""GRPO and its family: RL with verifiable rewards (`objective=grpo`; docs/grpo.md).

Through the objective seam, without a loop of its own: `next_window`, asked for each optimizer step's
micro-batches, generates a rollout when the last one is used up (the next batch of prompts from the
resumable prompt stream, `group_size` completions each from the engine, scored by the reward
registry, advantages per group), then serves it part by part: `updates_per_rollout` optimizer steps,
each `trainer.grad_accum` micro-batches of whole completions (sampler=budget: length-sorted micro-batches
within `sampler.max_tokens`, as many on every rank). `micro_loss` is the policy loss summed
over its units (align/objectives/policy_loss.py), `weight` the unit count.

Rollouts that cannot lie: before the first update of a rollout the trainer's log-probs of its tokens
(the same forward the update uses, in the same micro-batches) are compared with the engine's, and the
step's row records the mean and max |delta logp|, a KL estimate between the two and the spread of the
importance ratio p_trainer / p_engine. With one update per rollout that comparison is the update's own
forward (its detached log-probs are the loss's "old" ones, as in TRL); with several, a no-grad pass over
the whole rollout before its first part computes them. `is_correction=tis` weighs each token's loss by
the truncated ratio. A generation copy (`generation_dtype`) is synced before every rollout and its
weights' hash checked against the training weights' (cast alike): a stale sync stops the run.

Where the step goes: generation, weight sync, scoring, the old-log-prob pass, the reference forwards
are timed; the update is the rest of the step; the row reports the generation share and the rollout's
generated tokens/s beside the update's tokens/s.

This module is the objective's seam and the loss; the rollouts are made in align/objectives/grpo_rollouts.py,
the step's row in align/objectives/grpo_metrics.py, and its terms of the plan are align/objectives/grpo_terms.py.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Optional

import torch

from align.config import GRPOConfig, ISCorrection, ReferenceKind, TrainConfig
from align.data.collate import Batch
from align.errors import AlignError
from align.objectives import register
from align.objectives.grpo_metrics import add_mismatch, time_row, window_row
from align.objectives.grpo_rollouts import RolloutMaker
from align.objectives.grpo_terms import GRPOTerms
from align.objectives.logps import token_logps
from align.objectives.policy_loss import Aggregation, LossSpec, RatioLevel, policy_loss
from align.objectives.reference import AdaptersOff, kl_reference, prepare_reference
from align.objectives.rollout import Rollout, RolloutBatch
from align.objectives.rollout_rewards import check_sources
from align.objectives.rollout_stats import Sums
from align.objectives.router_flips import flips
from align.objectives.views import prompt_view
from align.parallel.env import DistEnv, autocast_context
from align.rewards import WeightedReward


@register
class GRPO(RolloutMaker):
    name = "grpo"
    terms = GRPOTerms
    # the clipped surrogate's value says little (about 0 with group-normalised advantages): the reward does
    console_metrics = (("reward", "reward/mean"), ("kl", "kl/ref_mean"), ("logp mismatch", "mismatch/logp_abs_mean"))
    view = staticmethod(prompt_view)

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg: GRPOConfig = cfg.objective
        self.train_cfg = cfg
        self.reward = WeightedReward.of(cfg.reward)
        self.spec = LossSpec(clip_low=self.cfg.clip_low, clip_high=self.cfg.clip_high,
                             level=RatioLevel(self.cfg.ratio_level.value),
                             aggregation=Aggregation(self.cfg.loss_agg.value), kl_coef=self.cfg.kl_coef)
        self.reference_kind = kl_reference(cfg)
        self.chunk = cfg.trainer.loss_chunk_tokens
        self._start_rollouts()
        self.reference: Any = None
        self.reference_sha256: Optional[str] = None
        self.softcap: Optional[float] = None

    # ----------------------------------------------------------------------------- building

    def build_data(self, cfg: TrainConfig, tokenizer: Any, env: DistEnv):
        from align.data.prompts import build_prompt_stream, load_prompts

        self.env, self.tokenizer = env, tokenizer
        self.prompts = load_prompts(cfg, tokenizer, self.reward)
        if self.cfg.max_turns > 1:
            from align.objectives.multi_turn import build_multi_turn

            self.multi_turn = build_multi_turn(cfg, tokenizer)
            # the share of trajectories that called a tool is what a tool-using run learns beside its reward
            self.console_metrics = (*type(self).console_metrics, ("tool calls", "rollout/tool_calls_mean"))
        return self.prompts.data, build_prompt_stream(cfg, self.prompts, tokenizer.pad_token_id, env.rank, env.world)

    def prepare(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        self.reference_sha256, frozen = prepare_reference(model, self.reference_kind, self.cfg.reference_dtype)
        if frozen is None:
            return []
        self.reference = frozen
        return [frozen.module]

    def bind(self, model: torch.nn.Module, forward: Callable[..., torch.Tensor], resuming: bool = False) -> None:
        from align.plan.generation_auto import require_generation_resolved

        require_generation_resolved(self.train_cfg, "the GRPO engine")
        self.model, self.forward = model, forward
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.device = next(model.parameters()).device
        if self.reward.model_path is not None and self.reward.model is None:  # once, on the training device
            from align.objectives.scoring_model import load_model_reward

            self.reward.model = load_model_reward(self.reward.model_path, self.device, self.reward.model_batch_size)
        # The engine generates under the trainer's autocast, so both sides compute in the same precision.
        self.autocast: Callable[[], Any] = autocast_context(self.train_cfg.trainer.precision, self.device.type)
        if self.reference_kind == ReferenceKind.adapters_off:
            self.reference = AdaptersOff(model)
        from align.objectives.rollout_engine import build_rollout_engine

        self.engine, self.router_train, self.router_gen = build_rollout_engine(
            self.cfg, self.train_cfg, model, self.tokenizer, self.env, multi_turn=self.multi_turn is not None)

    # ---------------------------------------------- rollouts: align/objectives/grpo_rollouts.py

    def _mismatch(self, trainer: torch.Tensor, engine: torch.Tensor, sampler: torch.Tensor) -> None:
        add_mismatch(self._sums, trainer, engine, sampler, self.cfg.is_cap)

    # ---------------------------------------------------------------------------------- seam

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
        return [self._batch(seqs, with_old=r.old_logps is not None).to(device) for seqs in part]

    def weight(self, batch: Batch) -> int:
        return batch.loss_tokens if self.spec.aggregation == Aggregation.token_mean else batch.n_seq

    def target_logps(self, forward: Callable, batch: RolloutBatch,
                     module: Optional[torch.nn.Module] = None) -> torch.Tensor:
        """Per completion token, in flattened target order: log softmax(logits / T) at the token (fp32)."""
        return self._logps_at(forward, batch, module)[0]

    def _logps_at(self, forward: Callable, batch: RolloutBatch, module: Optional[torch.nn.Module] = None):
        out = forward(batch.model_inputs(), hidden_only=True, module=module)
        head = (module or self.model).get_output_embeddings()
        return token_logps(out, batch.labels, head, self.chunk, self.softcap, self.cfg.temperature)

    def _first_forward(self, forward: Callable, batch: RolloutBatch) -> torch.Tensor:
        """The rollout's first training forward over `batch`: its log-probs, and (MoE) the router flip
        rate against the generation's routing of the same tokens."""
        if batch.gen_topk is None or self.router_train is None:
            return self.target_logps(forward, batch)
        with self.router_train.record() as rec:
            logp, keep = self._logps_at(forward, batch)
        s = self._sums
        s.add("rf_tokens", keep.numel())
        for i, layer in enumerate(rec.layers):
            s.add(f"rf/{layer}", flips(batch.gen_topk[i], rec.calls[layer][0].index_select(0, keep)).sum())
        return logp

    def _reference_logps(self, forward: Callable, batch: RolloutBatch) -> Optional[torch.Tensor]:
        if self.reference is None:
            return None
        t0 = time.perf_counter()
        ref = self.reference.sequence_logps(forward, self.target_logps, batch)
        self._timed("reference_s", t0)
        return ref.float()

    def micro_loss(self, forward: Callable[..., torch.Tensor], batch: Batch) -> torch.Tensor:
        assert isinstance(batch, RolloutBatch), type(batch)
        first = batch.old_logps is None  # one update per rollout: this is its first training forward
        logp = self._first_forward(forward, batch) if first else self.target_logps(forward, batch)
        seq = batch.target_seq()
        old = batch.old_logps if batch.old_logps is not None else logp.detach()
        if batch.old_logps is None:  # one update per rollout: this forward IS the pre-update recomputation
            self._mismatch(old, batch.engine_logps, batch.sampler_logps)
        is_w = None
        if self.cfg.is_correction == ISCorrection.tis:
            is_w = torch.exp(old - batch.sampler_logps).clamp(max=self.cfg.is_cap)
        out = policy_loss(logp, old, batch.advantages.index_select(0, seq), seq, batch.n_seq, self.spec,
                          ref=self._reference_logps(forward, batch), is_weight=is_w)
        for k, v in out.sums.items():
            self._sums.add(f"policy_{k}", v)
        self._sums.add("policy_tokens", out.tokens)
        self._sums.add("update_tokens", batch.tokens)
        return out.total

    def window_metrics(self) -> dict[str, Any]:
        sums, hi, lo = self._sums.reduce(self.env, self.device)
        row = dict(self._row)
        row.update(window_row(sums, hi, lo))
        total = time.perf_counter() - self._t_window if self._t_window is not None else 0.0
        row.update(time_row(sums, self._timers, total))
        self._sums, self._row = Sums(), {}
        return row

    # ------------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        ref = None if self.reference_kind is None else self.reference_kind.value
        scorer = self.reward.model  # loaded by bind: the manifest's sha256 of its weight files
        tools = {} if self.multi_turn is None else {n: t.sha256 for n, t in self.multi_turn.tools.tools.items()}
        return {"rollouts": self.rollouts, "reference": ref, "reference_sha256": self.reference_sha256,
                "reward_model_sha256": None if scorer is None else scorer.identity_files["weights_sha256"],
                "reward_functions_sha256": {n: f.sha256 for n, f in self.reward.functions.items()},
                "tools_sha256": tools}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from align.errors import ConfigError

        mine = self.state_dict()
        for k in ("reference", "reference_sha256"):
            if state.get(k) != mine[k]:
                raise ConfigError(f"objective.{k}", f"the checkpoint was trained against {state.get(k)!r}, "
                                  f"this run resolves {mine[k]!r}: resume with the run's own reference", mine[k])
        was, now = state.get("reward_model_sha256"), mine["reward_model_sha256"]
        if was != now:  # the rollouts so far were scored by another model: the advantages would change meaning
            said = lambda sha: "no reward model" if sha is None else f"a reward model of weights sha256 {sha}"  # noqa: E731
            raise ConfigError("reward.path", f"the checkpoint was scored by {said(was)}, this run by {said(now)}: "
                              "resume with the run's own reward model", self.reward.model_path)
        check_sources(state, mine)
        self.rollouts = int(state["rollouts"])

    def rank_state_dict(self) -> dict[str, Any]:
        return {"rollout": None if self.rollout is None else self.rollout.state_dict()}

    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        d = state.get("rollout")
        self.rollout = None if d is None else Rollout.from_state_dict(d)
        if self.rollout is not None:
            self._data = self.rollout.dataset()

    def gate(self, batch: Batch) -> Optional[dict[str, Any]]:
        return None  # the rollout's own check (trainer vs engine log-probs) runs on every rollout

    def describe(self) -> dict[str, Any]:
        c = self.cfg
        loss = {
            "kind": "grpo", "advantage": c.advantage.value, "loss_agg": c.loss_agg.value,
            "ratio_level": c.ratio_level.value, "clip": [c.clip_low, c.clip_high],
            "is_correction": c.is_correction.value, "is_cap": c.is_cap if c.is_correction == ISCorrection.tis else None,
            "old_logps": ("the update's own forward (one update per rollout)" if c.updates_per_rollout == 1 else
                          "a no-grad trainer pass over the rollout before its first update"),
            "kl": {"coef": c.kl_coef, "estimator": "k3" if c.kl_coef else None,
                   "reference": None if self.reference_kind is None else self.reference_kind.value,
                   "reference_sha256": self.reference_sha256,
                   "reference_dtype": c.reference_dtype.value if self.reference_kind == ReferenceKind.model else None},
            "sampling": {"group_size": c.group_size, "prompts_per_rollout": c.prompts_per_rollout,
                         "updates_per_rollout": c.updates_per_rollout, "max_new_tokens": c.max_new_tokens,
                         "temperature": c.temperature, "top_p": c.top_p,
                         "dynamic_sampling": c.dynamic_sampling,
                         "dynamic_sampling_rounds": c.dynamic_sampling_rounds if c.dynamic_sampling else None,
                         "seed": "sha256(trainer.seed/rollout index/rank/round)",
                         "max_turns": c.max_turns,
                         "tools": self.multi_turn.tools.identity() if self.multi_turn is not None else None},
            "reward": self.reward.identity(),
            "logps": {"chunk_tokens": self.chunk or None, "final_logit_softcapping": self.softcap,
                      "temperature": c.temperature},
            "engine": self.engine.describe() if self.engine is not None else None,
            "generation_dtype": c.generation_dtype.value,
            "router_flip_rate": ("per MoE layer: top-k set of the generation vs the training forward"
                                 if self.router_train is not None else None),
        }
        return {"kind": self.name, "loss": loss, "prompts": len(self.prompts)}
