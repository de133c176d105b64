"""`python -m align.train [overrides]`: compose, check, train. Nothing else lives here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from align.config import to_typed
from align.control.exit_record import write_exit
from align.control.signals import StopSignals
from align.errors import AlignError
from align.parallel.launch import ATTEMPT, rank_overrides, record_exit
from align.run.cli import CONF_DIR, absolute_config_path, die, job_preflight, preflight_command_line, wants_hydra_only
from align.run.hydra_files import STAGED_HYDRA, staging_overrides
from align.run.record import RunRecord
from align.run.run_dir import run_dir_held


def run(cfg: DictConfig, stop: StopSignals) -> int:
    from align.trainer import Trainer

    typed = to_typed(cfg)
    hc = HydraConfig.get()
    checks = job_preflight(typed, hc.overrides.task)  # the report of the pass before Hydra (run_preflight else)
    run_dir, staged = Path(hc.runtime.output_dir), hc.output_subdir == STAGED_HYDRA
    group = Path(hc.sweep.dir).name if hc.mode == RunMode.MULTIRUN else None
    record = RunRecord(typed, OmegaConf.to_container(cfg, resolve=True), run_dir, sys.argv[1:], list(hc.overrides.task),
                       staged=staged, sweep_dir=Path(hc.sweep.dir) if group else None)
    with record:  # provenance.json: every key from start(), completed on the way out whatever the exit code
        with stop.at_once():  # before step 1 there is nothing to save: a stop signal ends the run here (143)
            record.start(checks)
            trainer = Trainer.build(typed, run_dir, record.wandb_config, group, stop, plan=checks.plan)
            record.built(trainer)  # resolved backends, data hashes, sampler stats; mask gate before step 1
        return record.finished(trainer, trainer.fit())


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    with StopSignals() as stop:  # from here a signal never kills the job before its manifest and exit record
        try:
            code = run(cfg, stop)
        except AlignError as e:  # Hydra would print a traceback and exit 1; ours are one line and a code
            record_exit(e.exit_code)
            die(str(e), e.exit_code)
        record_exit(code)
    if code:
        raise SystemExit(code)


def main() -> None:
    argv = absolute_config_path(sys.argv[1:])  # a replay's `--config-path <run>/.hydra` (docs/provenance.md)
    rank = int(os.environ.get("RANK", "0"))
    run_dirs: list = []
    if not wants_hydra_only(argv):
        try:
            run_dirs = preflight_command_line(argv)  # every job, before Hydra creates a run dir
        except SystemExit as e:  # nothing was written anywhere: the code goes to a launcher's $ALIGN_EXIT_DIR only
            if isinstance(e.code, int) and e.code:
                write_exit(None, rank, e.code)
            raise
    run_dir = run_dirs[0] if len(run_dirs) == 1 and "-m" not in argv and "--multirun" not in argv else None
    ATTEMPT.held = run_dir_held(run_dir, rank)  # an earlier run's dir: nothing of this attempt there until accepted
    staging = staging_overrides(argv, run_dir)
    if staging:  # Hydra opens the attempt's log there before it writes the attempt's config
        (run_dir / STAGED_HYDRA).mkdir(exist_ok=True)
    # Hydra reads sys.argv: one edit. Ranks > 0 write no .hydra/; a used run dir stages this attempt's.
    sys.argv[1:] = argv + rank_overrides() + staging
    _hydra_main()


if __name__ == "__main__":
    main()
