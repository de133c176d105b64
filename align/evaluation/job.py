"""One `python -m align.eval` job: its arms (model_dir, compare_to, or the oracle) through the same
code, the cache around each arm, eval.json, eval.md, the samples files and W&B.

    EvalJob(cfg, run_dir, argv, overrides, resolved).run() -> exit code
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping, Optional

from align.core.caches import cache_location
from align.core.hashing import canonical_json, config_hash
from align.core.provenance import git_state, now
from align.errors import EXIT_OK, AlignError
from align.evaluation.config import EvalRunConfig, EvalTask
from align.evaluation.datasets import EvalData, load_data
from align.evaluation.eval_cache import EvalCache, cache_key, key_parts
from align.evaluation.eval_record import REPORT_JSON, REPORT_MD, EvalRecord, markdown
from align.evaluation.model_source import ModelSource, model_record, resolve_source
from align.evaluation.refusal import discriminate
from align.evaluation.runner import (
    ArmRun,
    essentials_of,
    generate_arm,
    generation_meaning,
    oracle_arm,
    prompts_per_call,
    sampling_spec,
    stop_ids,
)
from align.evaluation.scoring import Scorer, build_scorer

log = logging.getLogger("align")


def resolve_dtype(requested: Optional[str], device_type: str) -> str:
    return requested or ("bfloat16" if device_type == "cuda" else "float32")


class EvalJob:
    def __init__(self, cfg: EvalRunConfig, run_dir: Path, argv: list[str], overrides: list[str],
                 resolved: Mapping[str, Any]) -> None:
        from align.core.redaction import redact, redact_argv

        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.argv, self.overrides = redact_argv(list(argv)), redact_argv(list(overrides))
        self.resolved = redact(dict(resolved))
        self.record = EvalRecord(self.run_dir)
        self.arms: dict[str, ArmRun] = {}

    # ---------------------------------------------------------------------------------- the job

    def run(self) -> int:
        code, reason = 1, "failed"
        try:
            self._start()
            scorer = build_scorer(self.cfg.eval)
            data = load_data(self.cfg.eval, getattr(scorer, "verifier", None))
            self._record_inputs(data, scorer)
            for name, source in self._sources():
                self._arm(name, source, data, scorer)
            self._finish()
            code, reason = EXIT_OK, "completed"
            return code
        except AlignError as e:
            code, reason = e.exit_code, str(e)
            raise
        except BaseException as e:
            reason = f"{type(e).__name__}: {e}"
            raise
        finally:
            self.record.complete(code, reason)

    def _sources(self) -> list[tuple[str, Optional[ModelSource]]]:
        ev = self.cfg.eval
        if ev.oracle:
            return [("oracle", None)]
        arms = [("model", resolve_source(self.cfg.model_dir, "model_dir"))]
        if ev.compare_to:
            arms.append(("compare_to", resolve_source(ev.compare_to, "eval.compare_to")))
        return arms

    def _arm(self, name: str, source: Optional[ModelSource], data: EvalData, scorer: Scorer) -> None:
        ev = self.cfg.eval
        if source is None:
            run = oracle_arm(data, ev, scorer)
            arm = {"model": None, "engine": None,
                   "cache": {"enabled": False, "key": None, "hit": None, "path": None, "dir_source": None}}
            reasons = {"model": "oracle: the references are the completions, no model",
                       "engine": "oracle: nothing generated", "cache.key": "oracle: not cached (nothing to save)",
                       "cache.hit": "oracle: not cached", "cache.path": "oracle: not cached",
                       "cache.dir_source": "oracle: not cached"}
        else:
            run, arm, reasons = self._model_arm(name, source, data, scorer)
        self.arms[name] = run
        samples_file = self.run_dir / f"samples-{name}.jsonl"
        with samples_file.open("w") as f:
            for per in run.samples:
                for s in per:
                    f.write(json.dumps(s) + "\n")
        self.record.set(f"arms.{name}", {**arm, "metrics": run.metrics, "timing": run.timing,
                                          "samples_file": samples_file.name}, reasons)
        self.record.write("running")
        log.info("eval %s: %s", name, metrics_line(run.metrics))

    def _model_arm(self, name: str, source: ModelSource, data: EvalData, scorer: Scorer):
        import torch

        from align.parallel.env import resolve_device

        ev, gen = self.cfg.eval, self.cfg.generation
        device = resolve_device(self.cfg.device)
        dtype = resolve_dtype(self.cfg.dtype, device.type)
        identity = source.identity()
        parts = key_parts(model=identity, generation=generation_meaning(ev, gen, device.type, dtype),
                          data=data.meaning(ev), scorer=scorer.identity(), template=ev.template)
        where = cache_location("eval", ev.cache_dir, "eval.cache_dir")
        cache = EvalCache(Path(where["dir"])) if ev.cache else None
        cached = cache.get(parts) if cache else None
        reasons: dict[str, str] = {}
        if cached is not None:
            run = ArmRun(**cached["run"])
            model_info = cached["model"]
        else:
            model, tok, weights = source.load(device, getattr(torch, dtype))
            model_info = {**model_record(model), "weights": weights}
            from align.generation import build_engine

            engine = build_engine(gen, model, pad_token_id=tok.pad_token_id, eos_token_ids=stop_ids(tok, model))
            self._check_essentials(parts["generation"], engine.describe())
            with torch.no_grad():
                run = generate_arm(engine, tok, data, ev, scorer, prompts_per_call(gen, ev.samples), label=name)
            if cache:
                cache.put(parts, {"run": run.to_dict(), "model": model_info})
            del engine, model
        key = cache_key(parts)
        arm = {"model": {**identity, **model_info},
               "engine": run.engine,
               "cache": {"enabled": cache is not None, "key": key, "hit": cached is not None,
                         "path": str(cache.path(key)) if cache else None,
                         "dir_source": where["source"] if cache else None}}
        if cache is None:
            reasons["cache.path"] = reasons["cache.dir_source"] = "eval.cache=false: nothing read or written"
        for k, v in model_info.items():
            if v is None:
                reasons[f"model.{k}"] = f"the loaded model's config has no {k}"
        if identity["chat_template_sha256"] is None:
            reasons["model.chat_template_sha256"] = "the tokenizer has no chat template file or field"
        return run, arm, reasons

    @staticmethod
    def _check_essentials(meaning: Mapping[str, Any], describe: Mapping[str, Any]) -> None:
        """The key was computed before the engine existed: what the engine reports must agree, or the
        cache would file these completions under settings they were not made with."""
        got = essentials_of(dict(describe))
        want = {k: meaning[k] for k in got}
        if got != want:
            raise RuntimeError(f"the engine resolved {got}, the eval cache key says {want}")

    # -------------------------------------------------------------------------------- recording

    def _start(self) -> None:
        from align.core.provenance import versions

        cfg, r = self.cfg, self.record
        r.set("run", {"name": cfg.name or self.run_dir.name, "run_dir": str(self.run_dir.resolve()), "argv": self.argv,
                      "hydra_overrides": self.overrides, "host": socket.gethostname(), "pid": os.getpid(),
                      "start_time": now(), "end_time": None, "exit_code": None, "exit_reason": None},
              {k: "pending: the eval has not ended" for k in ("end_time", "exit_code", "exit_reason")})
        r.set("config", {"hash": config_hash(self.resolved), "resolved": self.resolved})
        g = git_state()
        git = {f: getattr(g, f) for f in ("root", "commit", "describe", "branch", "dirty", "diff_sha256")}
        r.set("git", {**git, "allow_dirty": cfg.allow_dirty},
              {f: g.reason or {"branch": "detached HEAD", "diff_sha256": "tree is clean: no diff"}.get(f, "unknown")
               for f, v in git.items() if v is None})
        v, why = versions()
        r.set("versions", v, {k.removeprefix("versions."): w for k, w in why.items()})
        ev = cfg.eval
        r.set("eval", {"task": ev.task.value, "oracle": ev.oracle, "oracle_shuffle": ev.oracle_shuffle,
                       "samples": ev.samples, "limit": ev.limit},
              {"limit": "no limit: every record"} if ev.limit is None else {})
        r.write("started")

    def _record_inputs(self, data: EvalData, scorer: Scorer) -> None:
        from align.core.provenance import device_info
        from align.parallel.env import resolve_device

        ev, r = self.cfg.eval, self.record
        why = {"fields.limit": "no limit: every record", "fields.id_field": "no id field: ids are line numbers"}
        fields = data.meaning(ev)
        r.set("dataset", {"path": str(data.path), "bundled": data.bundled, "sha256": data.sha256,
                          "records": len(data.items), "fields": fields, "template": ev.template},
              {k: w for k, w in why.items() if fields[k.split(".", 1)[1]] is None})
        r.set("scorer", {"kind": scorer.kind, "identity": scorer.identity()})
        if ev.oracle:
            r.set("generation", {"spec": None, "engine_config": None, "prompts_per_call": None},
                  {k: "oracle: nothing generated" for k in ("spec", "engine_config", "prompts_per_call")})
            r.null("device", "oracle: nothing runs on a device")
        else:
            gen = self.cfg.generation
            engine_config = json.loads(canonical_json(asdict(gen)))
            r.set("generation", {"spec": asdict(sampling_spec(ev)), "engine_config": engine_config,
                                 "prompts_per_call": prompts_per_call(gen, ev.samples)},
                  {"spec.stop_token_ids": "the engine's EOS ids (arms.<arm>.engine.eos_token_ids)"})
            dev, why = device_info(resolve_device(self.cfg.device))
            r.set("device", dev, {k.removeprefix("device."): w for k, w in why.items()})
        if ev.task == EvalTask.refusal:
            r.null("discriminator", "pending: computed once every arm is classified")
        else:
            r.null("discriminator", f"task {ev.task.value}: the discriminator reads refusal counts only")
        r.write("started")

    def _finish(self) -> None:
        if self.cfg.eval.task == EvalTask.refusal:
            self.record.set("discriminator", discriminate({n: a.metrics for n, a in self.arms.items()}))
        (self.run_dir / REPORT_MD).write_text(markdown(self.record.data))
        self._log_wandb()
        # the summary a person reads last: the arms' lines above it have scrolled away on a long eval
        for name, run in self.arms.items():
            log.info("result %s: %s", name, metrics_line(run.metrics))
        log.info("report %s, record %s", self.run_dir / REPORT_MD, self.run_dir / REPORT_JSON)

    def _log_wandb(self) -> None:
        from align.config import LoggerKind
        from align.telemetry.wandb_logger import build_logger, wandb_init_kwargs

        if self.cfg.logger.kind == LoggerKind.none:
            return
        name = self.cfg.name or self.run_dir.name
        logger = build_logger(self.cfg.logger, True, wandb_init_kwargs(self.cfg.logger, self.run_dir, name, None,
                                                                        self.resolved))
        summary = {f"eval/{arm}/{k}": v for arm, run in self.arms.items() for k, v in run.metrics.items()
                   if isinstance(v, (int, float))}
        logger.summary({**summary, "eval/task": self.cfg.eval.task.value})
        logger.finish(0)


def metrics_line(metrics: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
