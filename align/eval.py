"""`python -m align.eval model_dir=<export or checkpoint> eval=<name> [overrides]`: compose, check, evaluate.

Bad input (a missing model dir, an unknown eval, a prompts file without the field) is one line and
exit 2 for every job of the command line before Hydra creates a run dir. docs/evaluation.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

import align.evaluation.config  # noqa: F401  (registers eval_schema before Hydra composes)
from align.errors import AlignError
from align.run.cli import CONF_DIR, checked_run_dirs, die, wants_hydra_only


def run(cfg: DictConfig) -> int:
    from align.evaluation.config import to_typed
    from align.evaluation.job import EvalJob
    from align.evaluation.preflight import check

    typed = to_typed(cfg)
    check(typed)  # again per job (cheap): the files may have changed since the command line was checked
    hc = HydraConfig.get()
    job = EvalJob(typed, Path(hc.runtime.output_dir), sys.argv[1:], list(hc.overrides.task),
                  OmegaConf.to_container(cfg, resolve=True))
    return job.run()


@hydra.main(config_path=str(CONF_DIR), config_name="eval", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        code = run(cfg)
    except AlignError as e:  # Hydra would print a traceback and exit 1; ours are one line and a code
        die(str(e), e.exit_code)
    if code:
        raise SystemExit(code)


def main() -> None:
    if not wants_hydra_only(sys.argv[1:]):
        from align.evaluation.preflight import validate_command_line

        validate_command_line(sys.argv[1:])
        checked_run_dirs(sys.argv[1:], "eval", resumes=False)  # an eval never writes over another run
    _hydra_main()


if __name__ == "__main__":
    main()
