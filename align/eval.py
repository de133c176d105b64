"""`python -m align.eval model_dir=<export or checkpoint> eval=<name> [overrides]`: compose, check, evaluate.

Bad input (a missing model dir, an unknown eval, a prompts file without the field) is one line and
exit 2 for every job of the command line before Hydra creates a run dir. docs/evaluation.md.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

import align.evaluation.config  # noqa: F401  (registers eval_schema before Hydra composes)
from align.errors import AlignError
from align.run.cli import CONF_DIR, checked_run_dirs, die, wants_hydra_only


def run(cfg: DictConfig) -> int:
    from align.evaluation.config import to_typed
    from align.evaluation.eval_checks import check
    from align.evaluation.job import EvalJob

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


def validate_command_line(argv: Sequence[str]) -> list[align.evaluation.config.EvalRunConfig]:
    """Compose, type and check every job of `argv` (each point of a `-m` sweep); exit 2 with one line
    on the first bad one."""
    import dataclasses

    from align.evaluation.config import GROUP_SCHEMAS, EvalRunConfig, to_typed
    from align.evaluation.eval_checks import check
    from align.run.cli import compose, describe, job_override_lists

    jobs: list[EvalRunConfig] = []
    try:
        overrides, _ = job_override_lists(argv)
        for job in overrides:
            typed = to_typed(compose(job, config_name="eval"))
            check(typed)
            jobs.append(typed)
    except SystemExit:
        raise
    except AlignError as e:
        die(str(e), e.exit_code)
    except Exception as exc:  # every composition/value error becomes one line
        line = describe(exc, root=EvalRunConfig)
        group = line.split(".", 1)[0]
        if line.endswith(": unknown key") and group in GROUP_SCHEMAS:
            line += f"; accepted keys: {', '.join(f.name for f in dataclasses.fields(GROUP_SCHEMAS[group]))}"
        die(line)
    return jobs


def main() -> None:
    if not wants_hydra_only(sys.argv[1:]):
        validate_command_line(sys.argv[1:])
        checked_run_dirs(sys.argv[1:], "eval", resumes=False)  # an eval never writes over another run
    _hydra_main()


if __name__ == "__main__":
    main()
