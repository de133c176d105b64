"""One arm of an eval: render the prompts, generate n samples each through align.generation, score
them, and compute the arm's metrics. `evaluate` is the in-process entry (a trainer's eval hook);
`align.evaluation.job` wraps arms with the cache, the report and eval.json.

Prompts are rendered exactly as training renders a user turn: the tokenizer's chat template with the
assistant turn opened, tokenized without adding special tokens (the template holds them). Prompts are
generated longest first in calls of `batch_size // n` prompts (one backend batch per call), and call
c samples with seed derive_seed(eval.seed, c): the same settings draw the same completions.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Optional, Sequence

from align.evaluation.config import EvalConfig
from align.evaluation.datasets import EvalData, Item, load_data
from align.evaluation.scoring import Scorer, build_scorer
from align.generation import EngineConfig, SamplingSpec, build_engine, derive_seed, resolve_backend, resolve_mode


def sampling_spec(cfg: EvalConfig) -> SamplingSpec:
    t = cfg.resolved_temperature
    return SamplingSpec(max_new_tokens=cfg.max_new_tokens, temperature=t, top_p=cfg.top_p if t else 1.0,
                        top_k=cfg.top_k if t else 0, n=cfg.samples, seed=cfg.seed)


def prompts_per_call(engine: EngineConfig, n: int) -> int:
    return max(1, engine.batch_size // n)


def generation_meaning(cfg: EvalConfig, engine: EngineConfig, device_type: str, dtype: str) -> dict[str, Any]:
    """The generation part of the cache key: the spec and the engine settings a describe() reports
    that shape the completions (resolved mode, batching, numerics)."""
    spec = asdict(sampling_spec(cfg))
    return {"spec": spec, "backend": resolve_backend(engine)[0].value,
            "mode": resolve_mode(engine.mode, device_type).value,
            "batch_size": engine.batch_size, "pad_to_multiple_of": engine.pad_to_multiple_of, "dtype": dtype,
            "device_type": device_type, "prompts_per_call": prompts_per_call(engine, cfg.samples)}


def essentials_of(describe: dict[str, Any]) -> dict[str, Any]:
    """The same settings read back from a built engine's describe(): the job checks they agree."""
    return {"backend": describe["backend"], "mode": describe["mode"], "batch_size": describe["batch_size"],
            "pad_to_multiple_of": describe["pad_to_multiple_of"], "dtype": describe["dtype"],
            "device_type": describe["device"].split(":")[0]}


def render(tokenizer: Any, items: Sequence[Item], template: str) -> list[list[int]]:
    out = []
    for item in items:
        messages = [{"role": "user", "content": template.replace("{prompt}", item.prompt)}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def stop_ids(tokenizer: Any, model: Any) -> list[int]:
    """EOS of the tokenizer and of the model's generation config (a chat model may end turns on
    another token): the engine sets the model's generation config aside, so both are passed."""
    ids = {int(tokenizer.eos_token_id)}
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(int(t) for t in ([extra] if isinstance(extra, int) else (extra or [])))
    return sorted(ids)


class SampleProgress:
    """A bar with samples/s on a TTY; otherwise a line every tenth of the work."""

    def __init__(self, total: int, label: str, enabled: bool = True) -> None:
        from tqdm import tqdm

        self.total, self.label, self.enabled, self.done = total, label, enabled, 0
        self.tty = enabled and sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.bar = tqdm(total=total, desc=label, unit="sample", dynamic_ncols=True, disable=not self.tty)
        self._next = max(1, total // 10)

    def update(self, n: int) -> None:
        """The lines go through the `align` logger (the console and the run's log); under a bar, to the
        log file only (align/telemetry/progress.py)."""
        from align.telemetry.progress import to_log_files

        self.done += n
        self.bar.update(n)
        if self.enabled and (self.done >= self._next or self.done == self.total):
            rate = self.done / max(time.perf_counter() - self.t0, 1e-9)
            line = f"{self.label}: {self.done}/{self.total} samples, {rate:.2f} samples/s"
            if self.tty:
                to_log_files(line)
            else:
                logging.getLogger("align").info(line)
            self._next = self.done + max(1, self.total // 10)

    def close(self) -> None:
        self.bar.close()


@dataclass
class ArmRun:
    """A finished arm: per prompt, its scored samples; the arm's metrics, engine and timing."""

    samples: list[list[dict[str, Any]]]
    metrics: dict[str, Any]
    engine: Optional[dict[str, Any]]
    timing: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def generate_arm(engine: Any, tokenizer: Any, data: EvalData, cfg: EvalConfig, scorer: Scorer, per_call: int,
                 progress: bool = True, label: str = "eval") -> ArmRun:
    shard = generate_shard(engine, tokenizer, data, cfg, scorer, per_call, progress, label)
    return finish_arm(data, [shard], scorer, engine.describe())


def shard_order(prompts: Sequence[Sequence[int]], rank: int, world: int) -> tuple[list[int], int]:
    """The prompts rank `rank` of `world` generates: longest first (a function of the data), every
    world-th one, padded with the longest prompt to the same count on every rank so each makes the same
    number of backend calls (lockstep decoding needs that). Returns (the rank's prompts, how many of
    them are its own): the padding's completions are dropped."""
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))  # stable
    mine = order[rank::world]
    return mine + order[:1] * (-(-len(order) // world) - len(mine)), len(mine)


def generate_shard(engine: Any, tokenizer: Any, data: EvalData, cfg: EvalConfig, scorer: Scorer, per_call: int,
                   progress: bool = True, label: str = "eval", rank: int = 0, world: int = 1) -> dict[str, Any]:
    """Generate and score this rank's share of the prompts (all of them when world=1). Call c of rank
    r samples with seed derive_seed(eval.seed, c), or derive_seed(eval.seed, r, c) when world > 1."""
    prompts = render(tokenizer, data.items, cfg.template)
    spec = sampling_spec(cfg)
    order, real = shard_order(prompts, rank, world)
    texts: dict[int, list[Any]] = {i: [] for i in order[:real]}
    bar = SampleProgress(len(order) * spec.n, label, progress)
    t0, new_tokens, at_length = time.perf_counter(), 0, 0
    try:
        for call, start in enumerate(range(0, len(order), per_call)):
            idx = order[start:start + per_call]
            seed = derive_seed(spec.seed, *((rank,) if world > 1 else ()), call)
            for c in engine.generate([prompts[i] for i in idx], replace(spec, seed=seed)):
                if start + c.prompt_index < real:
                    texts[idx[c.prompt_index]].append(c)
                    new_tokens += c.num_tokens
                    at_length += c.finish_reason.value == "length"
            bar.update(len(idx) * spec.n)
    finally:
        bar.close()
    items = {it.index: it for it in data.items}
    return {"samples": {i: [_sample(items[i], c, tokenizer, scorer) for c in cs] for i, cs in texts.items()},
            "seconds": time.perf_counter() - t0, "new_tokens": new_tokens, "at_length": at_length}


def finish_arm(data: EvalData, shards: Sequence[dict[str, Any]], scorer: Scorer,
               engine: Optional[dict[str, Any]]) -> ArmRun:
    """The arm from every rank's shard (`generate_shard`): samples in record order, metrics, timing
    (generation seconds: the slowest rank's, the wall time of the whole arm)."""
    by_index = {i: per for shard in shards for i, per in shard["samples"].items()}
    samples = [by_index[item.index] for item in data.items]
    total = sum(len(per) for per in samples)
    seconds = max(shard["seconds"] for shard in shards)
    new_tokens = sum(shard["new_tokens"] for shard in shards)
    metrics = {**scorer.metrics(samples), "finished_at_length": sum(s["at_length"] for s in shards) / total,
               "mean_new_tokens": new_tokens / total}
    timing = {"generation_seconds": seconds, "samples": total, "samples_per_s": total / max(seconds, 1e-9),
              "new_tokens": new_tokens, "new_tokens_per_s": new_tokens / max(seconds, 1e-9)}
    return ArmRun(samples=samples, metrics=metrics, engine=engine, timing=timing)


def _sample(item: Item, c: Any, tokenizer: Any, scorer: Scorer) -> dict[str, Any]:
    text = tokenizer.decode(list(c.token_ids), skip_special_tokens=True)
    return {"index": item.index, "id": item.id, "sample": c.sample_index, "text": text, "num_tokens": c.num_tokens,
            "finish_reason": c.finish_reason.value, **scorer.score(item, text)}


def oracle_arm(data: EvalData, cfg: EvalConfig, scorer: Scorer) -> ArmRun:
    """The references scored as completions (n copies each); with `oracle_shuffle`, each record gets
    another record's reference (a seeded derangement): the control that must fall to chance."""
    import random

    refs = [it.reference for it in data.items]
    perm = list(range(len(refs)))
    if cfg.oracle_shuffle and len(refs) > 1:
        rng = random.Random(cfg.seed)
        while any(i == j for i, j in enumerate(perm)):
            rng.shuffle(perm)
    samples = [[{"index": it.index, "id": it.id, "sample": s, "text": refs[perm[it.index]], "num_tokens": None,
                 "finish_reason": None, **scorer.score(it, refs[perm[it.index]])} for s in range(cfg.samples)]
               for it in data.items]
    pairing = "shuffled: a derangement of the references" if cfg.oracle_shuffle else "each record's own reference"
    return ArmRun(samples=samples, metrics=scorer.metrics(samples), engine=None,
                  timing={"generation_seconds": 0.0, "samples": len(refs) * cfg.samples, "oracle_pairing": pairing})


def evaluate(model: Any, tokenizer: Any, eval_cfg: EvalConfig, device: Any,
             engine_cfg: Optional[EngineConfig] = None, progress: bool = False) -> dict[str, Any]:
    """Evaluate an in-memory model (e.g. the trainer's, mid-run) with the same code as `align.eval`:
    no cache (the weights change between calls), nothing written. The model must already be on
    `device`; its train/eval mode is restored by the engine. Returns {"metrics", "samples", "engine",
    "timing", "data"}."""
    import torch

    engine_cfg = engine_cfg or EngineConfig()
    where = next(model.parameters()).device
    if where.type != torch.device(device).type:
        raise ValueError(f"evaluate: the model is on {where}, not on {device}")
    scorer = build_scorer(eval_cfg)
    data = load_data(eval_cfg, getattr(scorer, "verifier", None))
    engine = build_engine(engine_cfg, model, pad_token_id=tokenizer.pad_token_id,
                          eos_token_ids=stop_ids(tokenizer, model))
    with torch.no_grad():
        run = generate_arm(engine, tokenizer, data, eval_cfg, scorer, prompts_per_call(engine_cfg, eval_cfg.samples),
                           progress=progress)
    return {**run.to_dict(), "data": data.meaning(eval_cfg)}
