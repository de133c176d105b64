"""Entry points besides `align.train` and `align.eval`: `python -m align.tools.<name>` (or `align <name>`)
for preflight, probe, report, annotate, supervise, inspect and docs."""

from __future__ import annotations

from typing import Sequence


def keyed_argv(argv: Sequence[str], positionals: Sequence[str], options: Sequence[str]) -> list[str]:
    """An argparse tool's arguments written as Hydra overrides, the style every align command takes:
    `name=value` for a positional (`dir=multirun/x`) or an option (`out=/tmp/r` for `--out /tmp/r`),
    beside the tool's own positionals and `--name value`. `positionals` and `options` are the tool's
    argument names in argparse order (every option takes one value). A token whose name is not one of
    them stays as it is (a path or a text may hold '=')."""
    named: dict[str, str] = {}
    bare: list[str] = []
    flags: list[str] = []
    tokens = iter(argv)
    for tok in tokens:
        key, eq, value = tok.partition("=")
        if eq and key in positionals:
            named[key] = value
        elif eq and key in options:
            flags += [f"--{key.replace('_', '-')}", value]
        elif tok.startswith("-") and len(tok) > 1:
            flags.append(tok)
            if not eq and tok.lstrip("-").replace("-", "_") in options:  # its value is the next token
                flags += [v for v in [next(tokens, None)] if v is not None]
        else:
            bare.append(tok)
    filled = []
    for p in positionals:  # in argparse's order; a gap leaves the rest to argparse's own error
        if p not in named and not bare:
            break
        filled.append(named.pop(p) if p in named else bare.pop(0))
    return [*filled, *bare, *named.values(), *flags]
