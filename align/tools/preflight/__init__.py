"""`python -m align.tools.preflight [overrides]`: print the pre-launch checklist for a config; exit 0 or 2.

A package, so that the command runs from its __main__.py while `python -m align.preflight` (align/preflight.py)
names the same `main` without a second module of that name."""

from __future__ import annotations

import sys
from typing import Sequence

from align.config import TrainConfig, to_typed
from align.errors import EXIT_CONFIG
from align.run.cli import validate_command_line
from align.run.preflight_checks import collect
from align.run.serving import lines, serving_path


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    code = 0
    for cfg in validate_command_line(argv):
        typed = cfg if isinstance(cfg, TrainConfig) else to_typed(cfg)
        m = typed.model
        print(f"align preflight: model={m.family.value}/{m.pretrained or m.preset.value} "
              f"attention={typed.attention.implementation.value} "
              f"optimizer={typed.optimizer.name.value} data={typed.data.source.value} logger={typed.logger.kind.value} "
              f"overrides: {' '.join(argv) or '(none)'}")
        report = collect(typed)
        print(report.render(), flush=True)
        if not report.ok:
            code = EXIT_CONFIG
            print("serving: not stated: the config failed preflight", flush=True)
            continue
        print("\n".join(lines(serving_path(typed, report.plan))), flush=True)
    return code
