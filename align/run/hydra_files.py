"""Hydra's own files in a run dir, which it writes before any align code runs: staged in `.hydra.pending/`
while an attempt in a dir that holds a run is not yet accepted (`staging_overrides`; align/run/record.py
moves them into place), rewritten with credentials redacted (`scrub_hydra_dir`, `scrub_sweep_record`),
and config.yaml rewritten as a config that replays the run (`write_replay_config`, docs/provenance.md)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Optional, Sequence

from align.core.redaction import redact, redact_argv
from align.run.run_dir import holds_run

STAGED_HYDRA = ".hydra.pending"


def launch_rank() -> int:
    """This process's rank as the launcher set it (0 outside torchrun), read before any process group."""
    return int(os.environ.get("RANK", "0"))


def staging_overrides(argv: Sequence[str], run_dir: Optional[Path]) -> list[str]:
    """Hydra writes `.hydra/` and opens its log before any align code runs: when the run dir (as
    align.run.run_dir planned it) already holds a run, have it write both to `.hydra.pending/` instead
    (rank 0 of a single run, unless the command sets `hydra.output_subdir` itself; the log unless the
    command picks its own job logging). The caller creates `.hydra.pending/`: the log opens before
    Hydra writes the config there."""
    if launch_rank() != 0 or any(a in ("-m", "--multirun") for a in argv) or run_dir is None:
        return []
    keys = [a.lstrip("+~") for a in argv]
    if any(k.startswith("hydra.output_subdir=") for k in keys) or not holds_run(run_dir):
        return []
    out = [f"hydra.output_subdir={STAGED_HYDRA}"]
    if not any(k.startswith(("hydra/job_logging", "hydra.job_logging")) for k in keys):
        out.append(f"hydra.job_logging.handlers.file.filename=${{hydra.runtime.output_dir}}/{STAGED_HYDRA}/"
                   "${hydra.job.name}.log")
    return out


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
