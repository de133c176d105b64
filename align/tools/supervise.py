"""`python -m align.tools.supervise [options] -- <train command>`: relaunch a training command after a
failure while its checkpoints advance (align/control/supervisor.py; docs/distributed.md). Options as
`--max-no-progress 3` or `max_no_progress=3`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from align.control.supervisor import Policy, Supervisor
from align.tools import keyed_argv


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m align.tools.supervise [options] -- <train command ...>", file=sys.stderr)
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="python -m align.tools.supervise")
    ap.add_argument("--max-no-progress", type=int, default=Policy.max_no_progress,
                    help="give up after this many attempts in a row without a newer complete checkpoint")
    ap.add_argument("--backoff", type=float, default=Policy.backoff_s,
                    help="seconds before the first relaunch (doubles)")
    ap.add_argument("--backoff-max", type=float, default=Policy.backoff_max_s)
    ap.add_argument("--run-dir", type=Path, default=None, help="run dir when the command has no hydra.run.dir=")
    args = ap.parse_args(keyed_argv(argv[:cut], (), ("max_no_progress", "backoff", "backoff_max", "run_dir")))
    command = argv[cut + 1:]
    if not command:
        ap.error("no command after --")
    policy = Policy(max_no_progress=args.max_no_progress, backoff_s=args.backoff, backoff_max_s=args.backoff_max)
    return Supervisor(command, args.run_dir, policy).run()


if __name__ == "__main__":
    raise SystemExit(main())
