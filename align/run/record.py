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

import logging
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from align.config import TrainConfig
from align.core.provenance import git_state
from align.core.redaction import REDACTED, recorded_env, redact, redact_argv, redact_logs
from align.errors import EXIT_CONFIG, EXIT_NONFINITE, EXIT_OK, EXIT_SIGNAL, AlignError
from align.parallel.compile import frames_over
from align.parallel.launch import ATTEMPT, adopt_rank_log, adopt_staged_log
from align.run.built_entries import record_compile, record_data, record_model
from align.run.hydra_files import STAGED_HYDRA, launch_rank, scrub_hydra_dir, scrub_sweep_record
from align.run.manifest import Manifest, dynamo_counters, flat
from align.run.start_entries import record_files, record_request, record_reward

if TYPE_CHECKING:
    from align.trainer import Trainer

log = logging.getLogger("align")


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
        self.manifest = Manifest(self.run_dir, enabled=launch_rank() == 0, staging=self.staging)
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
        record_request(m, cfg)
        from align.run.serving import serving_path

        m.set("serving", serving_path(cfg, getattr(preflight, "plan", None)))  # the job's plan, from its report
        record_reward(m, cfg)
        m.null("logger", "pending: the tracker starts when the run is built")
        record_files(m, cfg)
        m.write("started")

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
        from align.run import resolved

        self.accept()  # Trainer.build wrote nothing before its resume decision; from here the attempt counts
        self.trainer = trainer
        m, d = self.manifest, resolved.describe(trainer)
        info = d["model"]
        record_model(m, self.cfg, info)
        record_compile(m, info.get("compile_choice") or {})
        kind = self.cfg.sampler.kind.value
        m.set("sampler_budget", info.get("sampler_budget"), f"sampler={kind} takes no token budget")
        m.set("loss_chunk", info.get("loss_chunk"))
        m.set("run_length", info.get("run_length"))
        m.set("memory_budget", info.get("memory_budget"))
        dev, reasons = device_info(d["device"])
        m.update({f"device.{k}": v for k, v in dev.items()}, reasons)
        m.set("parallel.world_size", d["world_size"])
        m.set("model.autocast_dtype", d["autocast_dtype"], "no autocast: compute runs in the parameter dtype")
        record_data(m, d["data"], d["sampler_stats"])
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


