"""Objectives own their terms of the plan (align/objectives/plan_terms.py): no module outside
align/objectives/ and align/config/ asks which objective runs, and every objective brings its terms."""

from __future__ import annotations

import re
from pathlib import Path

ALIGN = Path(__file__).resolve().parents[3] / "align"
KIND = re.compile(r"\bobjective\.kind\b|\bObjectiveKind\b")
"""A use of the objective's kind: `cfg.objective.kind` (or `o.kind` compared with an `ObjectiveKind` enum)."""


def kind_branches(root: Path = ALIGN) -> list[str]:
    """`file:line: text` of each use of the objective's kind outside objectives/ and config/ under `root`."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in ("objectives", "config"):
            continue
        out += [f"{rel}:{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
                if KIND.search(line)]
    return out


def test_no_module_outside_objectives_and_config_branches_on_the_objective_kind():
    assert kind_branches() == []


def test_the_search_finds_a_planted_branch(tmp_path):
    (tmp_path / "objectives").mkdir()
    (tmp_path / "objectives" / "dpo.py").write_text("if cfg.objective.kind == ObjectiveKind.dpo: pass\n")
    (tmp_path / "plan").mkdir()
    (tmp_path / "plan" / "memory.py").write_text("x = 1\nrows = 2 if o.kind == ObjectiveKind.dpo else 1\n"
                                                 "if cfg.objective.kind.value == 'grpo': pass\n")
    assert kind_branches(tmp_path) == ["plan/memory.py:2: rows = 2 if o.kind == ObjectiveKind.dpo else 1",
                                       "plan/memory.py:3: if cfg.objective.kind.value == 'grpo': pass"]


def test_every_objective_has_its_class_and_its_plan_terms():
    from align.config import OBJECTIVE_SCHEMAS
    from align.objectives import objective_classes
    from align.objectives.plan_terms import PlanTerms

    assert set(objective_classes()) == set(OBJECTIVE_SCHEMAS)
    assert all(issubclass(c.terms, PlanTerms) for c in objective_classes().values())
