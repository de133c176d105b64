"""A preference pair's margin: TRL's RewardTrainer `margin` column, read from each record's `margin` field.

TRL subtracts it inside the Bradley-Terry loss, -logsigmoid(r_chosen - r_rejected - margin), so a pair
with a larger margin asks for a larger reward gap (align/objectives/reward_loss.py). Here:
- a record's `margin`, where present and not null, is a finite number; anything else (a string, a bool,
  NaN, an infinity) is a bad record naming its file:line (`BadMargin`, counted as `margin` under
  data.on_bad_record=skip);
- a data set has it on every pair or on none, as TRL's column (`check_column`);
- only an objective whose schema reads it (`ObjectiveConfig.reads_margin`) accepts pairs that carry one:
  any other would train as if the margins were not there, so it is refused naming the first pair with
  one (`refuse_unread`), in preflight (align/run/preflight_checks.py) and again at load, where the encode
  cache (whose key does not name the objective) may hold another objective's pairs.
The encoded pairs keep one float per pair (align/data/preference.py `EncodedPairs.margin`, None without
the column), collate gives each micro-batch its pairs' (align/data/pairs.py), and the stats say whether
the column was there (`stats`).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional, Sequence

from align.config.objective import OBJECTIVE_SCHEMAS
from align.data.files import BadRecord
from align.errors import ConfigError

COLUMN = "margin"
"""The record field, TRL's column name."""


class BadMargin(BadRecord):
    """A `margin` that is not a finite number."""

    reason = "margin"


def parse_margin(row: dict) -> Optional[float]:
    """The record's margin, or None where it has none (absent or null)."""
    value = row.get(COLUMN)
    if value is None:
        return None
    number = None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an integer too large for a float
            number = None
    if number is None or not math.isfinite(number):
        raise BadMargin(f"'{COLUMN}' is {value!r}; accepted: a finite number (TRL's RewardTrainer margin: the loss "
                        f"is -logsigmoid(r_chosen - r_rejected - margin)), or no '{COLUMN}' field")
    return number


def check_column(records: Sequence[Any]) -> None:
    """Refuse a data set whose pairs (each with `.margin` and `.where`) have a margin on some and not others."""
    first = next((r for r in records if r.margin is not None), None)
    lacking = next((r for r in records if r.margin is None), None)
    if first is not None and lacking is not None:
        raise ConfigError(lacking.where, f"the pair has no '{COLUMN}' while {first.where} has one; accepted: a "
                                         f"'{COLUMN}' on every pair or on none (TRL's margin is a column of the data)")


def stats(records: Sequence[Any]) -> Optional[dict[str, Any]]:
    """What the data stats record of the column: None without it, else its field, count, range and mean, and the
    first pair that has it (what a refusal names)."""
    values = [r.margin for r in records if r.margin is not None]
    if not values:
        return None
    return {"column": COLUMN, "pairs": len(values), "min": min(values), "max": max(values),
            "mean": sum(values) / len(values), "first": next(r.where for r in records if r.margin is not None)}


def readers() -> list[str]:
    """The objectives whose schema reads a pair's margin."""
    return [f"objective={kind}" for kind, schema in OBJECTIVE_SCHEMAS.items() if schema.reads_margin]


def refuse_unread(column: Optional[dict[str, Any]], objective: Any) -> None:
    """Refuse pairs with a margin (`column`: `stats`' record, None without one) under an objective that reads none."""
    if column is None or type(objective).reads_margin:
        return
    raise ConfigError(column["first"], f"the pair has a '{COLUMN}' (TRL's RewardTrainer margin), which "
                      f"{objective.option} does not read: it would train as if the margins were not there; accepted: "
                      f"pairs without '{COLUMN}', or an objective that reads it ({', '.join(readers())})")


def refuse_unpaired(where: str) -> None:
    """Refuse a pair with a margin read as unpaired examples (align/data/unpaired.py), which carry none."""
    raise ConfigError(where, f"the pair has a '{COLUMN}' (TRL's RewardTrainer margin); unpaired into a desirable "
                      "and an undesirable example it has nowhere to go, and the run would train as if it were not "
                      f"there; accepted: pairs without '{COLUMN}', or an objective that reads it "
                      f"({', '.join(readers())})")
