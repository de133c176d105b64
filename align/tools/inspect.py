"""`python -m align.tools.inspect [train overrides] [index=N] [tokens=true]`: one encoded record, exactly as
a run composed from the same overrides would train on it, with its loss mask visible.

    python -m align.tools.inspect                                   # record 0 of the default run's data
    python -m align.tools.inspect data=jsonl data.path=chat.jsonl index=3 tokens=true
    python -m align.tools.inspect model.pretrained=/ckpt/Mistral-7B-v0.3 data.max_seq_len=256
    python -m align.tools.inspect objective=grpo rollout=<run dir>/checkpoints/step_00000010 index=5

The overrides are align.train's (the same config groups and keys, validated the same way); `index`
(a record of the encoded data set, after truncation and drops, default 0) and `tokens` (add one line
per token) are this tool's own. The record comes from the run's own tokenizer, chat template and
encode cache (align.data.encode_cache.load_dataset: an entry it writes is the one the run then reads).
What a record is, and what of it is in the loss, is the objective's to say (`Objective.view`): sft one
chat record, its loss tokens the targets the model is trained to predict; dpo one pair, both sides,
their completions in the loss; grpo one prompt as the engine receives it, nothing of it in the loss,
with the rollout that generates and scores its completions and the reference answer the verifiers get.
`rollout=<checkpoint dir>` shows sequence `index` of the rollout a GRPO checkpoint recorded instead: a
completion, or a multi-turn trajectory whose tool messages sit out of the loss between the model's turns.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from align.errors import AlignError
from align.run.cli import die, validate_command_line

OPEN, CLOSE = "[[", "]]"
"""Around each run of tokens in the loss (plain text: not in the loss)."""


@dataclass
class Options:
    index: int = 0
    """Which record of the encoded data set (0-based): a pair for dpo, a prompt for grpo."""
    tokens: bool = False
    """Print one line per token (position, id, in the loss or not, its text) under the record."""
    rollout: Optional[str] = None
    """objective=grpo: a checkpoint dir (or its rank<r>.json) whose recorded rollout to show, `index` its
    sequence: a trajectory as the run trained on it (align/objectives/views.py `rollout_view`)."""


def split_argv(argv: Sequence[str]) -> tuple[Options, list[str]]:
    """This tool's own `index=` and `tokens=` apart from align.train's overrides; bad values exit 2."""
    opts, rest = Options(), []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or key not in ("index", "tokens", "rollout"):
            rest.append(arg)
        elif key == "rollout":
            opts.rollout = value
        elif key == "index":
            if not value.isdigit():
                die(f"index={value}: not a record index; accepted: an integer >= 0")
            opts.index = int(value)
        elif value.lower() in ("true", "false"):
            opts.tokens = value.lower() == "true"
        else:
            die(f"tokens={value}: accepted: true, false")
    if any(a in ("-m", "--multirun") for a in rest):
        die("-m: align.tools.inspect shows the data of one run; drop -m/--multirun and pick one value per key")
    return opts, rest


def segments(ids: Sequence[int], mask: Sequence[bool]) -> list[tuple[bool, list[int]]]:
    """Runs of consecutive tokens with the same loss flag, in order."""
    out: list[tuple[bool, list[int]]] = []
    for t, m in zip(ids, mask):
        if out and out[-1][0] == bool(m):
            out[-1][1].append(int(t))
        else:
            out.append((bool(m), [int(t)]))
    return out


def render(tok, ids: Sequence[int], mask: Sequence[bool], color: bool = False) -> str:
    """The record's text with every run of loss tokens between OPEN and CLOSE (and green on a terminal).
    Each run is decoded on its own, so a character split across a run boundary shows as a replacement."""
    parts = []
    for in_loss, run in segments(ids, mask):
        text = tok.decode(run, skip_special_tokens=False)
        if in_loss:
            text = f"{OPEN}\033[32m{text}\033[0m{CLOSE}" if color else f"{OPEN}{text}{CLOSE}"
        elif color:
            text = f"\033[2m{text}\033[0m"
        parts.append(text)
    return "".join(parts)


def token_lines(tok, ids: Sequence[int], mask: Sequence[bool]) -> list[str]:
    lines = [f"{'pos':>5} {'id':>7}  loss  token"]
    for pos, (t, m) in enumerate(zip(ids, mask)):
        text = tok.decode([int(t)], skip_special_tokens=False)
        lines.append(f"{pos:>5} {int(t):>7}  {'yes ' if m else ' -  '}  {text!r}")
    return lines


def inspect_record(cfg: Any, opts: Options, color: bool = False) -> str:
    """The text `main` prints for item `opts.index` of the data the run `cfg` trains on: the objective's
    own view of it (`Objective.view`, align/objectives/views.py), each sequence with its loss tokens marked."""
    from align.data.tokenizer import load_tokenizer
    from align.objectives import objective_class

    tok = load_tokenizer(cfg.model)
    if opts.rollout is not None:
        from align.objectives.views import rollout_view

        view = rollout_view(cfg, tok, opts.rollout, opts.index)
    else:
        view = objective_class(cfg).view(cfg, tok, opts.index)
    rule = "-" * 100
    out = [*view.header, f"{OPEN} ... {CLOSE}: {view.legend}"]
    for label, ids, mask in view.sequences:
        out += [label] if label else []
        out += [rule, render(tok, ids, mask, color), rule]
        if opts.tokens:
            out += token_lines(tok, ids, mask)
    out += view.footer
    return "\n".join(out) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    opts, overrides = split_argv(list(sys.argv[1:] if argv is None else argv))
    (cfg,) = validate_command_line(overrides)
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    try:
        text = inspect_record(cfg, opts, color)
    except AlignError as e:
        die(str(e), e.exit_code)
    except IndexError as e:
        die(str(e))
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
