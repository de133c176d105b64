"""The in-training eval: `eval=gsm8k trainer.eval_every=N` runs the `eval` group's eval on the model
being trained every N optimizer steps and at the last step, with the code of `python -m align.eval`
(align/evaluation/runner.py), and reports it as `eval/<metric>` keys of that step's history row.

Ranks. Under parallel=fsdp/ep every forward is collective (the weights are sharded), so rank 0 cannot
generate alone while the others wait: every rank generates its share of the prompts with lockstep
decoding (`EngineConfig.lockstep`), the shares are gathered and every rank scores the whole set, so
all ranks hold the same metrics.

What the eval must not change. Training's RNG streams: the engine seeds each call from `eval.seed`
inside `fork_rng`, and the whole eval runs inside one more `fork_rng`, so what it draws leaves the
training draws where they were. The model's train/eval mode: the engine puts the model in eval mode
and restores it. The step timing: the trainer times the next step from its own start. Compiled
training blocks (`trainer.compile`): generating through them (new shapes, no grad, a KV cache) made
dynamo recompile them until its limit sent the training blocks to eager, so on one process the eval
generates with its own copy of the model (deep copies carry no compile), synced and fingerprint-checked
before every eval; under fsdp/ep (sharded weights, no copy) the shared model generates with
compilation suspended (`torch.compiler.set_stance("force_eager")`) and a static, uncompiled cache.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import replace
from typing import Any, Callable, Optional

import torch

from align.config import TrainConfig
from align.errors import AlignError
from align.evaluation.datasets import load_data
from align.evaluation.runner import finish_arm, generate_shard, prompts_per_call, stop_ids
from align.evaluation.scoring import build_scorer
from align.generation import Engine, GenerateMode, build_engine
from align.generation.fingerprint import fingerprint
from align.parallel.env import DistEnv
from align.telemetry.progress import Phase

PREFIX = "eval/"


class TrainingEval:
    """Built once per run (the records are loaded and checked then); `run` at each due step."""

    def __init__(self, cfg: TrainConfig, env: DistEnv, tokenizer: Any) -> None:
        assert cfg.eval is not None
        self.cfg, self.env, self.tokenizer = cfg.eval, env, tokenizer
        self.every, self.last_step = cfg.trainer.eval_every, cfg.trainer.max_steps
        self.engine_cfg = replace(cfg.eval_generation, lockstep=env.distributed)
        self.scorer = build_scorer(self.cfg)
        self.data = load_data(self.cfg, getattr(self.scorer, "verifier", None))
        self.seconds, self.count = 0.0, 0
        self.described: Optional[dict[str, Any]] = None
        self.copy: Optional[Engine] = None
        """The eval's own copy of a compiled model (one process), kept across evals."""

    @classmethod
    def build(cls, cfg: TrainConfig, env: DistEnv, tokenizer: Any) -> Optional["TrainingEval"]:
        return cls(cfg, env, tokenizer) if cfg.eval is not None and cfg.trainer.eval_every > 0 else None

    def due(self, step: int) -> bool:
        """A function of the step alone, so a resumed run keeps the cadence of the run it continues."""
        return step % self.every == 0 or step == self.last_step

    def _engine(self, model: torch.nn.Module, compiled: bool
                ) -> tuple[Any, Callable[[], contextlib.AbstractContextManager]]:
        """The engine of this eval and a factory of the context it generates in (see the module
        docstring). A factory: calling `torch.compiler.set_stance` sets the stance at once, for the
        whole process, unless it is entered and left as a context."""
        kw = dict(pad_token_id=self.tokenizer.pad_token_id, eos_token_ids=stop_ids(self.tokenizer, model))
        if not compiled:
            return build_engine(self.engine_cfg, model, **kw), contextlib.nullcontext
        if self.env.distributed:
            cfg = self.engine_cfg
            if cfg.mode in (GenerateMode.auto, GenerateMode.compiled):
                cfg = replace(cfg, mode=GenerateMode.static)
            return build_engine(cfg, model, **kw), functools.partial(torch.compiler.set_stance, "force_eager")
        if self.copy is None:
            self.copy = build_engine(self.engine_cfg, model, copy=True, **kw)
        else:
            self.copy.sync_from(model)
        if self.copy.weights_hash() != fingerprint(model.state_dict().items()):
            raise AlignError("the eval copy does not hold the training weights after its sync")
        return self.copy, contextlib.nullcontext

    def run(self, model: torch.nn.Module, autocast: Callable[[], contextlib.AbstractContextManager] =
            contextlib.nullcontext, compiled: bool = False) -> dict[str, Any]:
        """Collective: every rank calls it at the same step. Returns the row's `eval/` keys. `compiled`:
        the training model's blocks are compiled (they must not see the eval's shapes)."""
        t0 = time.perf_counter()
        device = next(model.parameters()).device
        cuda = device.type == "cuda"
        index = (torch.cuda.current_device() if device.index is None else device.index) if cuda else None
        with torch.random.fork_rng(devices=[index] if cuda else [], device_type="cuda" if cuda else None):
            engine, stance = self._engine(model, compiled)
            with torch.no_grad(), autocast(), stance(), Phase("in-training eval", enabled=self.env.is_main):
                shard = generate_shard(engine, self.tokenizer, self.data, self.cfg, self.scorer,
                                       prompts_per_call(self.engine_cfg, self.cfg.samples), progress=False,
                                       rank=self.env.rank, world=self.env.world)
        shards = [shard]
        if self.env.distributed:
            shards = [None] * self.env.world
            torch.distributed.all_gather_object(shards, shard)
        arm = finish_arm(self.data, shards, self.scorer, engine.describe())
        seconds = time.perf_counter() - t0
        self.seconds, self.count = self.seconds + seconds, self.count + 1
        if self.described is None:
            self.described = {"engine": arm.engine, "data": self.data.meaning(self.cfg), "ranks": self.env.world,
                              "every": self.every, "scorer": self.scorer.identity()}
        return {**{PREFIX + k: v for k, v in flat(arm.metrics).items()}, f"{PREFIX}seconds": seconds,
                **{PREFIX + k: arm.timing[k] for k in ("samples", "samples_per_s", "new_tokens_per_s")}}

    def summary(self, wall_s: float) -> dict[str, Any]:
        """The run's eval cost: total seconds, their share of the wall time since fit() started, and
        what the eval resolved to (engine, data hash, scorer), once."""
        return {"eval": {"seconds": self.seconds, "count": self.count, "eval_share": self.seconds / max(wall_s, 1e-9),
                         "resolved": self.described}}


def flat(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested metrics (refusal counts) as `a/b` keys: a history row holds scalars."""
    out: dict[str, Any] = {}
    for k, v in metrics.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out
