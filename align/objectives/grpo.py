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
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch

from align.config import GenerationDtype, GRPOConfig, ISCorrection, ReferenceKind, SamplerKind, TrainConfig
from align.data.collate import Batch
from align.errors import AlignError
from align.objectives.advantages import advantages as group_advantages
from align.objectives.advantages import zero_variance
from align.objectives.logps import token_logps
from align.objectives.policy_loss import Aggregation, LossSpec, RatioLevel, k3, policy_loss
from align.objectives.reference import (
    AdaptersOff,
    kl_reference,
    prepare_reference,
)
from align.objectives.rollout import Rollout, RolloutBatch
from align.objectives.rollout_engine import GEN_DTYPES
from align.objectives.rollout_rewards import score_rollout
from align.objectives.rollout_stats import Sums, state_sha256
from align.objectives.router_flips import flips, generation_topk
from align.objectives.views import prompt_view
from align.parallel.env import DistEnv, autocast_context
from align.rewards import WeightedReward
from align.telemetry.progress import Phase


class StaleWeights(AlignError):
    """The generation copy does not hold the training weights after a sync: its rollout would be off-policy."""


class GRPO:
    name = "grpo"
    # the clipped surrogate's value says little (about 0 with group-normalised advantages): the reward does
    console_metrics = (("reward", "reward/mean"), ("kl", "kl/ref_mean"), ("logp mismatch", "mismatch/logp_abs_mean"))
    view = staticmethod(prompt_view)

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg: GRPOConfig = cfg.objective
        self.train_cfg = cfg
        self.reward = WeightedReward(cfg.reward.weights, function=cfg.reward.function, functions=cfg.reward.functions)
        self.spec = LossSpec(clip_low=self.cfg.clip_low, clip_high=self.cfg.clip_high,
                             level=RatioLevel(self.cfg.ratio_level.value),
                             aggregation=Aggregation(self.cfg.loss_agg.value), kl_coef=self.cfg.kl_coef)
        self.reference_kind = kl_reference(cfg)
        self.chunk = cfg.trainer.loss_chunk_tokens
        self.env: Optional[DistEnv] = None
        self.reference: Any = None
        self.reference_sha256: Optional[str] = None
        self.engine: Any = None
        self.rollout: Optional[Rollout] = None
        self.rollouts = 0
        """Rollouts generated so far (every rank the same): the next one's index, hence its seed."""
        self.softcap: Optional[float] = None
        self._sums = Sums()
        self._row: dict[str, Any] = {}
        self._t_window: Optional[float] = None
        self._timers: dict[str, float] = {}

    # ----------------------------------------------------------------------------- building

    def build_data(self, cfg: TrainConfig, tokenizer: Any, env: DistEnv):
        from align.data.prompts import build_prompt_stream, load_prompts

        self.env, self.tokenizer = env, tokenizer
        self.prompts = load_prompts(cfg, tokenizer, self.reward)
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
        # The engine generates under the trainer's autocast, so both sides compute in the same precision.
        self.autocast: Callable[[], Any] = autocast_context(self.train_cfg.trainer.precision, self.device.type)
        if self.reference_kind == ReferenceKind.adapters_off:
            self.reference = AdaptersOff(model)
        from align.objectives.rollout_engine import build_rollout_engine

        self.engine, self.router_train, self.router_gen = build_rollout_engine(self.cfg, self.train_cfg, model,
                                                                               self.tokenizer, self.env)

    # ------------------------------------------------------------------------------ rollouts

    def _seed(self, index: int, round_: int) -> int:
        from align.generation import derive_seed

        rank = self.env.rank if self.env is not None else 0
        return derive_seed(self.train_cfg.trainer.seed, index, rank, round_)

    def _timed(self, key: str, t0: float) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self._timers[key] = self._timers.get(key, 0.0) + now - t0
        return now

    def _sync_engine(self) -> Optional[str]:
        """Bring a generation copy up to date and check it; None when the engine shares the weights."""
        if self.cfg.generation_dtype == GenerationDtype.same:
            return None
        t0 = time.perf_counter()
        self.engine.sync_from(self.model)
        got = self.engine.weights_hash()
        want = state_sha256(self.model, GEN_DTYPES[self.cfg.generation_dtype])
        self._timed("sync_s", t0)
        if got != want:
            raise StaleWeights(f"rollout {self.rollouts}: the generation copy's weights (sha256 {got[:16]}) are not "
                               f"the training weights cast to {self.cfg.generation_dtype.value} ({want[:16]}): "
                               "the sync did not take; refusing to train on a stale rollout")
        return got

    def _generate(self, rows: np.ndarray, round_: int):
        from align.generation import SamplingSpec

        prompts = [self.prompts.prompt(int(i)) for i in rows]
        spec = SamplingSpec(max_new_tokens=self.cfg.max_new_tokens, temperature=self.cfg.temperature,
                            top_p=self.cfg.top_p, n=self.cfg.group_size, seed=self._seed(self.rollouts, round_))
        t0 = time.perf_counter()
        rec = self.router_gen.record() if self.router_gen is not None else contextlib.nullcontext()
        with torch.no_grad(), self.autocast(), rec:
            out = self.engine.generate(prompts, spec)
        self._timed("generation_s", t0)
        topk = None
        if self.router_gen is not None:
            topk = generation_topk(self.router_gen, [len(p) for p in prompts], spec.n, self.cfg.generation_batch_size,
                                   [c.num_tokens for c in out])
        return prompts, out, topk

    def _score(self, rows: np.ndarray, completions: list) -> tuple[np.ndarray, dict[str, float]]:
        t0 = time.perf_counter()
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        out = score_rollout(self.reward, self.prompts, rows, completions, decode, self._any_rank)
        self._timed("scoring_s", t0)
        return out

    def _round(self, batches: Iterator[Batch], round_: int) -> dict[str, Any]:
        """One generation round: the next prompt batch, its groups, scored."""
        rows = np.asarray(next(batches).rows, dtype=np.int64)
        prompts, out, topk = self._generate(rows, round_)
        rewards, parts = self._score(rows, out)
        g = self.cfg.group_size
        if topk is not None:  # per completion: [layers, its tokens, k]
            ends = np.cumsum([0] + [c.num_tokens for c in out])
            topk = [torch.stack([t[a:b] for t in topk]) for a, b in zip(ends[:-1], ends[1:])]
        return {"rows": rows, "prompts": prompts, "out": out, "rewards": rewards.reshape(len(rows), g), "parts": parts,
                "topk": topk}

    def _any_rank(self, flag: bool) -> bool:
        if self.env is None or not self.env.distributed:
            return flag
        return bool(self.env.all_reduce_sum(torch.tensor([float(flag)], device=self.device)).item() > 0)

    def _agree_counts(self, counts: list[int]) -> list[int]:
        """Micro-batches per part that every rank runs: the max over ranks."""
        if self.env is None or not self.env.distributed:
            return counts
        return [int(c) for c in self.env.all_reduce_max(torch.tensor(counts, device=self.device)).tolist()]

    def _groups(self, batches: Iterator[Batch]) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """The rollout's groups (one dict per prompt), replacing zero-variance ones by later rounds' groups
        when `dynamic_sampling` (every rank runs the same number of rounds: generation is collective under FSDP)."""
        first = self._round(batches, 0)
        stats = {"groups_generated": len(first["rows"]), "rounds": 1.0}
        groups = [self._group(first, i) for i in range(len(first["rows"]))]
        parts = dict(first["parts"])
        stats["zero_variance_first_round"] = float(sum(g["flat"] for g in groups))
        rounds = self.cfg.dynamic_sampling_rounds if self.cfg.dynamic_sampling else 0
        for round_ in range(1, rounds + 1):
            if not self._any_rank(any(g["flat"] for g in groups)):
                break
            more = self._round(batches, round_)
            stats["rounds"] += 1
            stats["groups_generated"] += len(more["rows"])
            fresh = [self._group(more, i) for i in range(len(more["rows"]))]
            useful = iter([g for g in fresh if not g["flat"]])
            groups = [next(useful, g) if g["flat"] else g for g in groups]
            for k, v in more["parts"].items():
                parts[k] = parts.get(k, 0.0) + v
        return groups, {**stats, **{f"parts/{k}": v for k, v in parts.items()}}

    def _group(self, rnd: dict[str, Any], i: int) -> dict[str, Any]:
        g = self.cfg.group_size
        outs = rnd["out"][i * g:(i + 1) * g]
        r = rnd["rewards"][i]
        topk = None if rnd["topk"] is None else rnd["topk"][i * g:(i + 1) * g]
        return {"row": int(rnd["rows"][i]), "prompt": rnd["prompts"][i], "outs": outs, "rewards": r, "topk": topk,
                "flat": bool(zero_variance(torch.from_numpy(r[None]))[0])}

    def _new_rollout(self, batches: Iterator[Batch], micro: int) -> None:
        weights = self._sync_engine()
        with Phase(f"rollout {self.rollouts}", enabled=self.env is None or self.env.is_main, quiet=True):
            groups, stats = self._groups(batches)  # a rollout that lasts long says so
        rewards = torch.from_numpy(np.stack([g["rewards"] for g in groups]))
        adv = group_advantages(rewards, self.cfg.advantage.value).reshape(-1).numpy()
        seqs = [(g["row"], gi, g["prompt"], o) for gi, g in enumerate(groups) for o in g["outs"]]
        lens = [len(p) + o.num_tokens for _, _, p, o in seqs]
        r = Rollout(
            index=self.rollouts,
            rows=np.array([s[0] for s in seqs], dtype=np.int64), group=np.array([s[1] for s in seqs], dtype=np.int64),
            prompt_lens=np.array([len(s[2]) for s in seqs], dtype=np.int64),
            tokens=np.concatenate([np.asarray(list(p) + list(o.token_ids), dtype=np.int32) for _, _, p, o in seqs]),
            offsets=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
            engine_logps=np.concatenate([np.asarray(o.logprobs, dtype=np.float32) for *_, o in seqs]),
            sampler_logps=np.concatenate([np.asarray(o.sampler_logprobs, dtype=np.float32) for *_, o in seqs]),
            rewards=rewards.reshape(-1).numpy(), advantages=adv,
            stopped=np.array([o.finish_reason.value == "stop" for *_, o in seqs]))
        if self.router_gen is not None and all(g["topk"] is not None for g in groups):
            r.router_topk = torch.cat([t for g in groups for t in g["topk"]], dim=1)
        if self.train_cfg.sampler.kind == SamplerKind.budget:
            r.cut_budget(self.cfg.updates_per_rollout, self.train_cfg.sampler, self._agree_counts)
        else:
            r.cut(self.cfg.updates_per_rollout, micro)
        r.meta = {"weights_sha256": weights, "groups": len(groups),
                  "zero_variance_groups": int(zero_variance(rewards).sum()), **stats}
        self.rollout, self.rollouts = r, self.rollouts + 1
        self._data = r.dataset()
        if self.cfg.updates_per_rollout > 1:
            self._recompute_old()
        self._rollout_metrics(r)

    def _recompute_old(self) -> None:
        """The trainer's log-probs of every completion token before the rollout's first update, in the
        micro-batches the updates will use (every rank the same number of forwards)."""
        t0 = time.perf_counter()
        r = self.rollout
        old = np.zeros_like(r.engine_logps)
        coff = r.completion_offsets()
        with torch.no_grad():
            for step in r.parts:
                for seqs in step:
                    b = self._batch(seqs, with_old=False).to(self.device)
                    lp = self._first_forward(self.forward, b).detach().float().cpu().numpy()
                    old[np.concatenate([np.arange(coff[s], coff[s + 1]) for s in seqs])] = lp
                    self._mismatch(torch.from_numpy(lp), b.engine_logps.cpu(), b.sampler_logps.cpu())
        r.old_logps = old
        self._timed("old_logps_s", t0)

    def _batch(self, seqs: np.ndarray, with_old: bool) -> RolloutBatch:
        s = self.train_cfg.sampler
        return self.rollout.batch(seqs, self.tokenizer.pad_token_id, s.pad_to_multiple_of, s.packed, s.mask_padding,
                                  with_old=with_old, data=self._data)

    def _rollout_metrics(self, r: Rollout) -> None:
        """This rank's rollout statistics as sums: the step's row reduces them over ranks."""
        m, s = r.meta, self._sums
        lens = r.completion_lens
        for key, v in (("seqs", r.size), ("reward", r.rewards.sum()), ("reward_sq", (r.rewards ** 2).sum()),
                       ("groups", m["groups"]), ("zero_var", m["zero_variance_groups"]),
                       ("zero_var_first", m["zero_variance_first_round"]), ("abs_adv", np.abs(r.advantages).sum()),
                       ("tokens", lens.sum()), ("stopped", r.stopped.sum()),
                       ("generated", m["groups_generated"] * self.cfg.group_size)):
            s.add(f"ro_{key}", float(v))
        for k, v in m.items():
            if k.startswith("parts/"):
                s.add(f"ro_part/{k.removeprefix('parts/')}", v)
        # Every rank runs the same rollouts and rounds; the hash is of this rank's copy (rank 0's row).
        self._row.update({"rollout/index": r.index, "rollout/rounds": m["rounds"],
                          "rollout/weights_sha256": m["weights_sha256"]})

    @staticmethod
    def _rollout_row(sums: dict[str, float]) -> dict[str, Any]:
        n, groups = sums["ro_seqs"], sums["ro_groups"]
        mean = sums["ro_reward"] / n
        row = {"reward/mean": mean, "reward/std": max(sums["ro_reward_sq"] / n - mean ** 2, 0.0) ** 0.5,
               "reward/zero_variance_frac": sums["ro_zero_var"] / groups,
               "reward/zero_variance_first_round": sums["ro_zero_var_first"] / groups,
               "advantage/abs_mean": sums["ro_abs_adv"] / n, "rollout/sequences": int(n),
               "rollout/tokens": int(sums["ro_tokens"]), "rollout/completion_len_mean": sums["ro_tokens"] / n,
               "rollout/stop_frac": sums["ro_stopped"] / n}
        row.update({f"reward/{k.removeprefix('ro_part/')}": v / sums["ro_generated"]
                    for k, v in sums.items() if k.startswith("ro_part/")})
        return row

    def _mismatch(self, trainer: torch.Tensor, engine: torch.Tensor, sampler: torch.Tensor) -> None:
        """Accumulate the trainer-vs-engine comparison of one micro-batch's completion tokens."""
        d = (trainer.detach().double() - engine.double())
        ratio = torch.exp(trainer.detach().double() - sampler.double())
        s = self._sums
        s.add("mm_tokens", d.numel())
        s.add("mm_abs", d.abs().sum())
        s.add("mm_kl", k3(trainer.detach().double(), engine.double()).sum())
        s.add("is_sum", ratio.sum())
        s.add("is_sq", (ratio ** 2).sum())
        s.add("is_over_cap", (ratio > self.cfg.is_cap).sum())
        s.extreme("mm_abs", d.abs())
        s.extreme("is_ratio", ratio)

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
        if sums.get("ro_seqs"):
            row.update(self._rollout_row(sums))
        t = sums.get("policy_tokens", 0.0)
        if t:
            row.update({"policy/clip_frac": sums["policy_clipped"] / t, "policy/ratio_mean": sums["policy_ratio"] / t})
            if "policy_kl" in sums:
                row["kl/ref_mean"] = sums["policy_kl"] / t
        if sums.get("mm_tokens"):
            n = sums["mm_tokens"]
            mean = sums["is_sum"] / n
            row.update({"mismatch/logp_abs_mean": sums["mm_abs"] / n, "mismatch/logp_abs_max": hi["mm_abs"],
                        "mismatch/kl": sums["mm_kl"] / n, "mismatch/is_ratio_mean": mean,
                        "mismatch/is_ratio_std": max(sums["is_sq"] / n - mean ** 2, 0.0) ** 0.5,
                        "mismatch/is_ratio_min": lo["is_ratio"], "mismatch/is_ratio_max": hi["is_ratio"],
                        "mismatch/is_over_cap_frac": sums["is_over_cap"] / n})
        if sums.get("rf_tokens"):
            layers = {k: v / sums["rf_tokens"] for k, v in sums.items() if k.startswith("rf/")}
            row.update({f"router_flip/l{k.removeprefix('rf/')}": v for k, v in layers.items()})
            row["router_flip/mean"] = sum(layers.values()) / len(layers)
        row.update(self._time_metrics(sums))
        self._sums, self._row = Sums(), {}
        return row

    def _time_metrics(self, sums: dict[str, float]) -> dict[str, Any]:
        total = time.perf_counter() - self._t_window if self._t_window is not None else 0.0
        phases = ("generation_s", "sync_s", "scoring_s", "old_logps_s", "reference_s")
        tm = {k: self._timers.get(k, 0.0) for k in phases}
        update = max(total - sum(tm.values()), 0.0)
        out = {f"time/{k}": v for k, v in tm.items()}
        out.update({"time/update_s": update, "time/generation_share": tm["generation_s"] / total if total else None,
                    "time/update_tokens_per_s": sums.get("update_tokens", 0.0) / update if update else None,
                    "rollout/tokens_per_s": (sums["ro_tokens"] / tm["generation_s"]
                                             if sums.get("ro_tokens") and tm["generation_s"] else None)})
        return out

    # ------------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        ref = None if self.reference_kind is None else self.reference_kind.value
        return {"rollouts": self.rollouts, "reference": ref, "reference_sha256": self.reference_sha256}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from align.errors import ConfigError

        mine = self.state_dict()
        for k in ("reference", "reference_sha256"):
            if state.get(k) != mine[k]:
                raise ConfigError(f"objective.{k}", f"the checkpoint was trained against {state.get(k)!r}, "
                                  f"this run resolves {mine[k]!r}: resume with the run's own reference", mine[k])
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
                         "seed": "sha256(trainer.seed/rollout index/rank/round)"},
            "reward": self.reward.identity(),
            "logps": {"chunk_tokens": self.chunk or None, "final_logit_softcapping": self.softcap,
                      "temperature": c.temperature},
            "engine": self.engine.describe() if self.engine is not None else None,
            "generation_dtype": c.generation_dtype.value,
            "router_flip_rate": ("per MoE layer: top-k set of the generation vs the training forward"
                                 if self.router_train is not None else None),
        }
        return {"kind": self.name, "loss": loss, "prompts": len(self.prompts)}
