"""The run wrapped in its manifest: `align.train.run()` opens a RunRecord before `Trainer.build`,
records what the components resolved to once built (and runs the mask gate), and completes the
manifest in `__exit__` with the exit code, whatever ended the run.

    record = RunRecord(typed, container, run_dir, argv, overrides)
    with record:
        record.start(preflight_report)
        trainer = Trainer.build(typed, run_dir, record.wandb_config, group)
        record.built(trainer)
        return record.finished(trainer, trainer.fit())

A run dir that already holds a run (a resume, a restart) is not touched before the new attempt is
accepted: `staging_overrides` has Hydra write this attempt's `.hydra/` to `.hydra.pending/`, the
manifest goes there too, and `accept()` (at `built()`: resume decided, checkpoint loaded) moves both
into place. A start refused before that (exit 2: another run's checkpoint, one that does not load)
deletes `.hydra.pending/`; any other early exit completes the attempt's manifest there.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from align.config import TrainConfig
from align.core.hashing import tokenizer_hashes
from align.core.provenance import git_state
from align.core.redaction import REDACTED, recorded_env, redact, redact_argv, redact_logs
from align.errors import EXIT_CONFIG, EXIT_NONFINITE, EXIT_OK, EXIT_SIGNAL, AlignError
from align.parallel.compile import frames_over
from align.parallel.launch import ATTEMPT, adopt_rank_log, adopt_staged_log
from align.run.manifest import Manifest, dynamo_counters, flat
from align.run.run_dir import holds_run

if TYPE_CHECKING:
    from align.trainer import Trainer

log = logging.getLogger("align")


STAGED_HYDRA = ".hydra.pending"


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def staging_overrides(argv: Sequence[str], run_dir: Optional[Path]) -> list[str]:
    """Hydra writes `.hydra/` and opens its log before any align code runs: when the run dir (as
    align.run.run_dir planned it) already holds a run, have it write both to `.hydra.pending/` instead
    (rank 0 of a single run, unless the command sets `hydra.output_subdir` itself; the log unless the
    command picks its own job logging). The caller creates `.hydra.pending/`: the log opens before
    Hydra writes the config there."""
    if _rank() != 0 or any(a in ("-m", "--multirun") for a in argv) or run_dir is None:
        return []
    keys = [a.lstrip("+~") for a in argv]
    if any(k.startswith("hydra.output_subdir=") for k in keys) or not holds_run(run_dir):
        return []
    out = [f"hydra.output_subdir={STAGED_HYDRA}"]
    if not any(k.startswith(("hydra/job_logging", "hydra.job_logging")) for k in keys):
        out.append(f"hydra.job_logging.handlers.file.filename=${{hydra.runtime.output_dir}}/{STAGED_HYDRA}/"
                   "${hydra.job.name}.log")
    return out


class RunRecord:
    def __init__(
        self,
        cfg: TrainConfig,
        container: Mapping[str, Any],
        run_dir: Path,
        argv: list[str],
        overrides: list[str],
        staged: bool = False,
        sweep_dir: Optional[Path] = None,
    ) -> None:
        """`staged`: Hydra wrote this attempt's config to `.hydra.pending/` (staging_overrides);
        `sweep_dir`: the sweep this job belongs to (its multirun.yaml is redacted too)."""
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.staging: Optional[Path] = self.run_dir / STAGED_HYDRA if staged else None
        self.redacted: list[str] = []
        self.resolved = redact(dict(container), found=self.redacted)
        self.argv = redact_argv(list(argv))
        self.overrides = redact_argv(list(overrides))
        self.redacted += [f"override:{o.split('=', 1)[0]}" for o in self.overrides if o.endswith(f"={REDACTED}")]
        self.env, env_redacted = recorded_env()
        self.redacted += [f"env:{n}" for n in env_redacted]
        self.manifest = Manifest(self.run_dir, enabled=_rank() == 0, staging=self.staging)
        self.trainer: Optional["Trainer"] = None
        self._code: Optional[int] = None
        self._reason = "completed"
        if self.manifest.enabled:
            scrub_hydra_dir(self.staging or self.run_dir / ".hydra")
            if sweep_dir is not None:
                scrub_sweep_record(sweep_dir)
        redact_logs()  # train.log and the console (W&B's output.log): the rule of every written value
        # W&B records sys.argv as the run's `args`; Hydra has parsed it by now, so drop secret values.
        sys.argv[1:] = redact_argv(sys.argv[1:])

    @property
    def wandb_config(self) -> dict[str, Any]:
        """The config W&B gets: the resolved config with secret-named values redacted."""
        return self.resolved

    # ------------------------------------------------------------------------------ stages

    def start(self, preflight: Any) -> None:
        """Written before any heavy work: every key present, what is known from config and disk."""
        from align.core.provenance import versions
        from align.models.family import family_of

        cfg, m = self.cfg, self.manifest
        m.start(
            name=cfg.name or self.run_dir.name,
            argv=self.argv,
            overrides=self.overrides,
            resolved=self.resolved,
            git=git_state(),
            allow_dirty=cfg.allow_dirty,
            redacted=self.redacted,
            env=self.env,
            preflight=preflight.as_list() if hasattr(preflight, "as_list") else list(preflight),
        )
        v, reasons = versions()
        m.update({f"versions.{k}": val for k, val in v.items()}, reasons)
        m.update(
            {
                "seed": cfg.trainer.seed,
                "parallel.kind": cfg.parallel.kind.value,
                "parallel.world_size": int(os.environ.get("WORLD_SIZE", "1")),
                "model.family": family_of(cfg.model).value,
                "model.attn_implementation_requested": cfg.attention.implementation.hf_name,
                "model.experts_implementation_requested": cfg.model.moe.experts.value
                if cfg.model.moe.experts
                else None,
                "sampler.kind": cfg.sampler.kind.value,
            },
            {
                "model.experts_implementation_requested": "not requested: the library default applies "
                "(resolved value recorded)"
                if is_moe(cfg)
                else f"{family_of(cfg.model).value} is a dense family: no experts kernel"
            },
        )
        if cfg.model.pretrained:
            m.update({"model.pretrained": cfg.model.pretrained})
            m.null("model.preset", "built from a checkpoint, not a preset")
        else:
            m.update({"model.preset": cfg.model.preset.value})
            m.null("model.pretrained", "random init from a preset: no checkpoint")
        from align.run.serving import serving_path

        m.set("serving", serving_path(cfg, getattr(preflight, "plan", None)))  # the job's plan, from its report
        self._record_reward()
        m.null("logger", "pending: the tracker starts when the run is built")
        self._record_files()
        m.write("started")

    def _record_files(self) -> None:
        from align.data.sources import content_sha256, source_path
        from align.data.tokenizer import tokenizer_dir

        m, cfg = self.manifest, self.cfg
        path = source_path(cfg.data)
        m.update({"data.source": cfg.data.source.value, "data.path": str(path), "data.sha256": content_sha256(path)})
        tok_sha, tmpl_sha, files = tokenizer_hashes(tokenizer_dir(cfg.model))
        m.set("data.tokenizer_sha256", tok_sha, "no tokenizer files found")
        m.set("data.chat_template_sha256", tmpl_sha, "the tokenizer has no chat template file or field")
        m.set("data.aux_files", {str(path): m.data["data"]["sha256"], **files})
        from align.run.preflight_checks import encode_cache_key

        m.set(
            "data.encode_cache_key",
            encode_cache_key(cfg),
            "this build has no encode cache: every run encodes from scratch",
        )
        from align.core.caches import encode_location

        m.set("data.encode_cache_dir", encode_location(cfg.data.cache_dir) if cfg.data.cache else None,
              "data.cache=false: nothing read or written")
        m.null("data.encode_meta", "pending: read from the encoded dataset after build")
        m.null("data.format", "pending: detected from the records when they are read")

    def _record_reward(self) -> None:
        from align.objectives import objective_class

        cfg = self.cfg
        if cfg.reward.function is None and not cfg.reward.functions:
            weights = dict(cfg.reward.weights)
            self.manifest.null("reward", f"no python reward: reward.weights is {weights}" if weights
                               else f"objective={objective_class(cfg).name} reads no reward")
            return
        from align.rewards.combine import function_specs
        from align.rewards.function import function_key, load_function

        specs = function_specs(cfg.reward.function, cfg.reward.functions)  # preflight's imports, reused
        self.manifest.set("reward", {n: load_function(s, function_key(n)).identity() for n, s in specs.items()})

    def accept(self) -> None:
        """This attempt now owns the run dir: its `.hydra/` and manifest replace the earlier attempt's,
        its log is appended to the run's (rank r > 0: its held records to rank<r>/train.log) and its exit
        will be recorded there."""
        ATTEMPT.accepted = True
        adopt_rank_log()
        staging, self.staging = self.staging, None
        if staging is None or not self.manifest.enabled:
            return
        adopt_staged_log(staging, self.run_dir)
        self.manifest.unstage()
        hydra = self.run_dir / ".hydra"
        shutil.rmtree(hydra, ignore_errors=True)
        os.replace(staging, hydra)

    def built(self, trainer: "Trainer") -> None:
        """After Trainer.build: what the run RESOLVED to (align/run/resolved.py), then the gates before
        step 1: the mask gate and the objective's own (each report, or its failure, recorded)."""
        from align.core.provenance import device_info
        from align.models.family import family_of
        from align.run import resolved

        self.accept()  # Trainer.build wrote nothing before its resume decision; from here the attempt counts
        self.trainer = trainer
        m, d = self.manifest, resolved.describe(trainer)
        info = d["model"]
        keys = {
            "model_class": "model.class",
            "attn_implementation_resolved": "model.attn_implementation_resolved",
            "experts_implementation_resolved": "model.experts_implementation_resolved",
            "dtype": "model.dtype",
            "params_total": "model.params_total",
        }
        for src, dst in keys.items():
            if src in info:
                m.set(dst, info[src], f"{src} is null in BuiltModel.info")
            else:
                m.null(dst, f"BuiltModel.info has no {src}")
        if m.data["model"]["experts_implementation_resolved"] is None and not is_moe(self.cfg):
            m.null(
                "model.experts_implementation_resolved",
                f"{family_of(self.cfg.model).value} is a dense family: no experts kernel",
            )
        known = set(keys) | {
            "family",
            "preset",
            "pretrained",
            "attn_implementation_requested",
            "experts_implementation_requested",
            "compile_choice",
            "sampler_budget",
            "run_length",
            "loss_chunk",
            "memory_budget",
        }
        m.set("model.extra", {k: v for k, v in info.items() if k not in known | {"weights"}})
        m.set("model.weights", info.get("weights"), "random init from a preset: no checkpoint loaded")
        self._record_compile(info.get("compile_choice") or {})
        kind = self.cfg.sampler.kind.value
        m.set("sampler_budget", info.get("sampler_budget"), f"sampler={kind} takes no token budget")
        m.set("loss_chunk", info.get("loss_chunk"))
        m.set("run_length", info.get("run_length"))
        m.set("memory_budget", info.get("memory_budget"))
        dev, reasons = device_info(d["device"])
        m.update({f"device.{k}": v for k, v in dev.items()}, reasons)
        m.set("parallel.world_size", d["world_size"])
        m.set("model.autocast_dtype", d["autocast_dtype"], "no autocast: compute runs in the parameter dtype")
        self._record_data(d["data"], d["sampler_stats"])
        family, kernels, why = resolved.sdpa_kernel_record(trainer)
        m.set("model.sdpa_kernel_family", family, why)
        m.set("model.sdpa_kernels", kernels, why)
        m.null("mask_probe", "pending: the mask gate runs next")
        m.set("objective", d["objective"])
        m.set("logger", trainer.logger.describe(), f"logger={self.cfg.logger.kind.value}: history.jsonl only")
        m.write("built")
        self._gate("mask_probe", lambda: resolved.check_masks(trainer))
        failed = {**d["objective"], "gate": {"ran": True, "ok": False}}  # the record, with why the gate refused
        self._gate("objective", lambda: resolved.check_objective(trainer), failed)
        m.write("built")
        trainer.logger.summary(flat(m.data))

    def _gate(self, key: str, check: Callable[[], dict[str, Any]], failed: Optional[dict[str, Any]] = None) -> None:
        """Run a gate; its report goes under `key`, or, when it refuses the run, why (inside `failed`'s
        "gate" entry when given, else as the whole value)."""
        try:
            self.manifest.set(key, check())
        except AlignError as e:
            if failed is None:
                self.manifest.set(key, {"ok": False, "error": str(e)})
            else:
                self.manifest.set(key, {**failed, "gate": {**failed["gate"], "error": str(e)}})
            raise

    def _record_compile(self, choice: dict[str, Any]) -> None:
        m = self.manifest
        for key in ("trainer", "optimizer", "loss", "expected_compiles_per_frame"):
            m.set(f"compile.{key}", choice.get(key), "dynamic=false compiles a graph per shape: no count to expect")
        m.set("compile.recompile_limit", choice.get("recompile_limit"),
              "the blocks do not compile and the optimizer step sets no limit")
        m.set("compile.inductor_cache", choice.get("inductor_cache"), "nothing compiles in this run")
        off = "nothing compiles in this run" if choice.get("inductor_cache") is None else \
            "trainer.compile_artifacts is null"
        m.set("compile.artifacts", choice.get("artifacts"), off)
        m.set("compile.memory_budget", choice.get("memory_budget"), "trainer.compile is off: no partitioner runs")
        m.null("compile.frames_over_expected", "pending: read at the end of the run")

    def _record_data(self, data: dict[str, Any], sampler: dict[str, Any]) -> None:
        m = self.manifest
        m.set("data.encode_stats", data["stats"] or {}, "the encoded dataset reports no stats")
        # The encoded dataset's own provenance (align.data.encode_cache: `.meta`) is what the run actually
        # used, cache hit or miss: prefer it to what start() computed from the files.
        meta = data["meta"] or {}
        m.set("data.encode_meta", meta or None, "the encoded dataset carries no .meta (no encode cache in this build)")
        m.set("data.format", meta.get("formats"), "the encoded dataset does not say which record format it read")
        for src, key in (
            ("encode_cache_key", "data.encode_cache_key"),
            ("tokenizer_sha256", "data.tokenizer_sha256"),
            ("chat_template_sha256", "data.chat_template_sha256"),
        ):
            if meta.get(src) is not None:
                m.set(key, meta[src])
        aux = dict(m.data["data"]["aux_files"] or {})
        for f in [*meta.get("sources", []), *meta.get("aux_files", [])]:
            if isinstance(f, dict) and f.get("path") and f.get("sha256"):
                aux[str(f["path"])] = f["sha256"]
        m.set("data.aux_files", aux)
        m.set("sampler.stats", sampler)

    def finished(self, trainer: "Trainer", code: int) -> int:
        self.trainer = trainer
        self._code = int(code)
        known = {
            EXIT_OK: "completed",
            EXIT_NONFINITE: "non-finite halt (see HALT.json)",
            EXIT_SIGNAL: "coordinated stop on a signal (resumable)",
        }
        self._reason = known.get(int(code), f"trainer returned {code}")
        return code

    # ----------------------------------------------------------------------------- closing

    def __enter__(self) -> "RunRecord":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        code, reason = self._code, self._reason
        if exc is not None:
            code, reason = exit_of(exc)
        elif code is None:
            code, reason = 1, "the run ended without reporting an exit code"
        if self.staging is not None and code == EXIT_CONFIG:  # refused before it was accepted: leave no trace
            if self.manifest.enabled:
                shutil.rmtree(self.staging, ignore_errors=True)
            return
        m = self.manifest
        counters, why = dynamo_counters()
        m.set("dynamo", counters, why)
        if counters and counters["recompile_limit_hits"]:
            log.warning(
                "dynamo hit its recompile limit %d time(s): those frames ran eager from then on "
                "(provenance.json dynamo; TORCH_LOGS=recompiles says why)",
                counters["recompile_limit_hits"],
            )
        if self.trainer is not None:
            self._check_recompiles()
            if self.manifest.data["compile"].get("artifacts") is not None:  # what the run's end saved
                m.set("compile.artifacts", self.trainer.model_info["compile_choice"]["artifacts"])
            try:
                m.set("throughput", self.trainer.summary())
            except Exception as e:  # bookkeeping never masks the run's own outcome
                m.null("throughput", f"trainer.summary() raised {type(e).__name__}: {e}")
        else:
            m.null("throughput", "the trainer was never built")
        if m.data["run"]["start_time"] is None:  # failed before start(): still a complete, honest manifest
            m.update({"run.argv": self.argv, "run.run_dir": str(self.run_dir.resolve())})
        m.complete(code, reason)

    def _check_recompiles(self) -> None:
        """More graphs in a frame than the run's compile settings explain: a guard that keeps failing
        (a Python value, a new dtype), which costs a compile each time and, at dynamo's limit, the frame."""
        expected = self.manifest.data["compile"]["expected_compiles_per_frame"]
        if expected is None:
            self.manifest.null("compile.frames_over_expected", "no count to expect (or the trainer was not built)")
            return
        over = frames_over(expected)
        self.manifest.set("compile.frames_over_expected", over)
        if over:
            log.warning("%d frame(s) compiled more graphs than the %d expected (%s): a guard keeps failing; "
                        "TORCH_LOGS=recompiles says which (provenance.json compile)", len(over), expected, over)


def is_moe(cfg: TrainConfig) -> bool:
    from align.models.family import family_spec

    return family_spec(cfg.model).is_moe


def exit_of(exc: BaseException) -> tuple[int, str]:
    """The exit code and one-line reason a propagating exception will end the process with."""
    if isinstance(exc, AlignError):
        return exc.exit_code, f"{type(exc).__name__}: {exc}"
    if isinstance(exc, SystemExit):
        c = exc.code
        return (c if isinstance(c, int) else (0 if c is None else 1)), f"SystemExit({c!r})"
    if isinstance(exc, KeyboardInterrupt):
        return 130, "interrupted (KeyboardInterrupt)"
    first = str(exc).splitlines()[0] if str(exc) else ""
    return 1, f"{type(exc).__name__}: {first}"[:500]


def scrub_hydra_dir(hydra_dir: Path) -> None:
    """Hydra writes the composed config and the command-line overrides to .hydra/ before any align
    code runs: rewrite them with credentials redacted, and config.yaml as a config that replays the run."""
    if not hydra_dir.is_dir():
        return
    from omegaconf import OmegaConf

    for name in ("config.yaml", "overrides.yaml", "hydra.yaml"):
        path = hydra_dir / name
        if not path.is_file():
            continue
        node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        if name == "config.yaml":
            write_replay_config(path, redact(node))
            continue
        clean = redact_argv(node) if name == "overrides.yaml" else redact_hydra_record(copy.deepcopy(node))
        if clean != node:
            OmegaConf.save(OmegaConf.create(clean), path)


def redact_hydra_record(node: dict[str, Any]) -> dict[str, Any]:
    """hydra.yaml or a sweep's multirun.yaml under the rule of every written value: the override lists
    key by key (`name=<redacted>` keeps its key), then every value (align.core.redaction)."""
    hydra = node.get("hydra") or {}
    for kind, overrides in (hydra.get("overrides") or {}).items():
        if isinstance(overrides, list):
            hydra["overrides"][kind] = redact_argv(overrides)
    job = hydra.get("job") or {}
    if job.get("override_dirname"):
        job["override_dirname"] = ",".join(redact_argv(job["override_dirname"].split(",")))
    return redact(node)


def scrub_sweep_record(sweep_dir: Path) -> None:
    """Hydra writes the sweep's whole command to multirun.yaml before any job runs: redact it as hydra.yaml."""
    from omegaconf import OmegaConf

    path = Path(sweep_dir) / "multirun.yaml"
    if path.is_file():
        node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        clean = redact_hydra_record(copy.deepcopy(node))
        if clean != node:
            OmegaConf.save(OmegaConf.create(clean), path)


REPLAY_HEADER = """\
# The composed config of this run, replayable into a new run dir (docs/provenance.md, "Replay"):
#   python -m align.train --config-path {dir} --config-name config [overrides]
# `defaults` puts the schemas back under the values (Hydra saved them without), so they are
# typed and validated as in the original run; `hydra` is conf/hydra/default.yaml, so the replay
# gets a fresh run dir instead of writing into this one. Redacted credentials must be passed again.
"""


def write_replay_config(path: Path, values: dict[str, Any]) -> None:
    """config.yaml = the schema default, the conf/hydra run-dir settings, then the run's values."""
    from omegaconf import OmegaConf

    from align.config import schema_defaults
    from align.run.cli import CONF_DIR

    body = {k: v for k, v in values.items() if k not in ("defaults", "hydra")}
    hydra = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "hydra" / "default.yaml"), resolve=False)
    text = OmegaConf.to_yaml(OmegaConf.create({"defaults": schema_defaults(body), "hydra": hydra, **body}))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(REPLAY_HEADER.format(dir=path.parent.resolve()) + text)
    os.replace(tmp, path)
