"""`align <command> [arguments]` (the console script pyproject.toml installs) and `python -m align <command>`:
one door to every entry point. Each command runs the same `main` as `python -m <module>`, with the same
arguments: Hydra overrides (`key=value`, `group=option`) for all of them; report and annotate also take
their paths positionally, and supervise takes the command it relaunches after `--`.

Nothing is imported before the command is known (no torch, no Hydra): `align --help` answers at once,
and an unknown command is one line and exit 2.
"""

from __future__ import annotations

import importlib
import sys
from typing import Optional, Sequence

COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("align.train", "compose a run, check it, train it"),
    "eval": ("align.eval", "evaluate an export or checkpoint: model_dir=<dir> eval=<name>"),
    "preflight": ("align.tools.preflight", "the pre-launch checklist for a training config; exit 0 or 2"),
    "inspect": ("align.tools.inspect", "one encoded record as the run trains on it: [index=N] [tokens=true]"),
    "probe": ("align.tools.probe", "a triage probe on the composed run: probe=padding|mask|scaling|kernels"),
    "report": ("align.tools.report", "one row per job of a sweep: dir=<multirun dir> (or the dir alone)"),
    "annotate": ("align.tools.annotate", "a correction beside a manifest: run_dir=<run> text=<...> [affects=a,b]"),
    "supervise": ("align.tools.supervise", "relaunch a training command while its checkpoints advance: -- <cmd>"),
    "docs": ("align.tools.docs", "regenerate docs/configuration.md"),
}
"""Command -> (the module whose `main` runs it, one line for `align --help`)."""


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    return "\n".join(["usage: align <command> [overrides ...]   (the same as python -m <module> [overrides ...])",
                      "", "commands:", *rows, "",
                      "`align <command> --help`: that command's own help (Hydra's for train, eval and probe)."])


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage(), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"align: error: unknown command {name!r}; commands: {', '.join(COMMANDS)} (align --help)",
              file=sys.stderr)
        return 2
    module = COMMANDS[name][0]
    # Every entry reads sys.argv as `python -m <module>` would set it (Hydra parses it itself).
    sys.argv = [f"align {name}", *rest]
    code = importlib.import_module(module).main()
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    raise SystemExit(main())
