"""GRPO's rollouts (align/objectives/grpo.py): the generation copy synced and hash-checked, a round of
prompts generated `group_size` times each and scored, zero-variance groups replaced by later rounds'
(`dynamic_sampling`), advantages per group, the rollout cut into its updates' micro-batches, and the
trainer's log-probs before the first update where several updates share the rollout.

`RolloutMaker` is the half of `GRPO` that makes rollouts; it reads what `GRPO` sets up: `cfg`, `train_cfg`,
`env`, `device`, `tokenizer`, `prompts`, `reward`, `engine`, `multi_turn`, `model`, `forward`, `autocast`,
`router_train`, `router_gen`, `rollout`, `rollouts`, `_sums`, `_row`, `_timers`, `_data`, and its `_first_forward`
and `_mismatch`."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Optional

import numpy as np
import torch

from align.config import GenerationDtype, SamplerKind
from align.data.collate import Batch
from align.errors import AlignError
from align.objectives.advantages import advantages as group_advantages
from align.objectives.advantages import zero_variance
from align.objectives.grpo_metrics import add_rollout
from align.objectives.rollout import Rollout, RolloutBatch
from align.objectives.rollout_rewards import score_rollout
from align.objectives.rollout_stats import Sums, state_sha256
from align.objectives.router_flips import generation_topk
from align.telemetry.progress import Phase

GEN_DTYPES = {GenerationDtype.bf16: torch.bfloat16, GenerationDtype.fp32: torch.float32}
"""The torch dtype of a generation copy, by `objective.generation_dtype`."""


class StaleWeights(AlignError):
    """The generation copy does not hold the training weights after a sync: its rollout would be off-policy."""


class RolloutMaker:
    """Generates, scores and cuts GRPO's rollouts (see the module's docstring for what it reads of `GRPO`)."""

    cfg: Any
    train_cfg: Any
    rollout: Optional[Rollout]
    multi_turn: Any = None
    """A `MultiTurn` (align/objectives/multi_turn.py) where the rollouts call tools; None: single-turn."""

    def _start_rollouts(self) -> None:
        """The state every rollout-making objective starts with (GRPO's and distillation's constructors)."""
        self.env = None
        self.engine = None
        self.router_train = self.router_gen = None
        """The router flip record's recorders of the training forward and of generation (MoE:
        align/objectives/rollout_engine.py); None without a record."""
        self.rollout = None
        self.rollouts = 0
        """Rollouts generated so far (every rank the same): the next one's index, hence its seed."""
        self._sums = Sums()
        self._row: dict[str, Any] = {}
        self._t_window: Optional[float] = None
        self._timers: dict[str, float] = {}

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
            if self.multi_turn is None:
                out = self.engine.generate(prompts, spec)
            else:  # tools: trajectories of several engine calls (align/objectives/multi_turn.py)
                out = self.multi_turn.run(self.engine, prompts, spec)
        self._timed("generation_s", t0)
        return prompts, out, self._routing(prompts, out, spec.n)

    def _routing(self, prompts: list, out: list, n: int) -> Optional[list[torch.Tensor]]:
        """Per completion, [MoE layers, its tokens, k] the experts generation routed its tokens to: what align's
        engine recorded beside each token, or hf's recorded calls mapped back to rows; None without a record."""
        if self.router_train is None:
            return None
        if self.router_gen is None:
            return None if any(c.router_topk is None for c in out) else [c.router_topk for c in out]
        flat = generation_topk(self.router_gen, [len(p) for p in prompts], n, self.cfg.generation_batch_size,
                               [c.num_tokens for c in out])
        if flat is None:
            return None
        ends = np.cumsum([0] + [c.num_tokens for c in out])
        return [torch.stack([t[a:b] for t in flat]) for a, b in zip(ends[:-1], ends[1:])]

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
        multi = self.multi_turn is not None
        body = (lambda o: o.body) if multi else (lambda o: o.token_ids)  # noqa: E731
        r = Rollout(
            index=self.rollouts,
            rows=np.array([s[0] for s in seqs], dtype=np.int64), group=np.array([s[1] for s in seqs], dtype=np.int64),
            prompt_lens=np.array([len(s[2]) for s in seqs], dtype=np.int64),
            tokens=np.concatenate([np.asarray(list(p) + list(body(o)), dtype=np.int32) for _, _, p, o in seqs]),
            offsets=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
            engine_logps=np.concatenate([np.asarray(o.logprobs, dtype=np.float32) for *_, o in seqs]),
            sampler_logps=np.concatenate([np.asarray(o.sampler_logprobs, dtype=np.float32) for *_, o in seqs]),
            rewards=rewards.reshape(-1).numpy(), advantages=adv,
            stopped=np.array([o.finish_reason.value == "stop" for *_, o in seqs]))
        if multi:
            r.loss_mask = np.concatenate([np.r_[np.zeros(len(p), dtype=bool), np.asarray(o.mask, dtype=bool)]
                                          for _, _, p, o in seqs])
            stats.update({k: float(sum(getattr(o, k) for *_, o in seqs)) for k in ("turns", "tool_calls",
                                                                                  "tool_errors")})
        if self.router_train is not None and all(g["topk"] is not None for g in groups):
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
        self._row.update(add_rollout(self._sums, r, self.cfg.group_size))

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
