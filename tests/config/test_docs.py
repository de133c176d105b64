"""docs/configuration.md is generated from the schemas; it must match what the code says now. docs/performance.md
is the page a user reads: short, and every figure on it is one the benchmark log records."""

import re
from pathlib import Path

from align.tools.docs import OUT, render

DOCS = Path(__file__).resolve().parents[2] / "docs"
PERFORMANCE, LOG = DOCS / "performance.md", DOCS / "benchmarks" / "log.md"
# A measured figure as the docs write it: 86,899, 1.46, 63.3 or 45%; the `%` and `x` of 63.3% and 7.12x do not matter.
FIGURE = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+\.\d+|\d+(?=%))(?![\d])")


def test_configuration_reference_is_up_to_date():
    assert OUT.read_text() == render(), "run `python -m align.tools.docs` and commit docs/configuration.md"


def test_the_performance_page_stays_under_250_lines():
    """One current table per workload, the levers and the negatives; dated history goes to docs/benchmarks/log.md."""
    n = len(PERFORMANCE.read_text(encoding="utf-8").splitlines())
    assert n < 250, f"docs/performance.md has {n} lines: move dated readings to docs/benchmarks/log.md"


def test_every_figure_on_the_performance_page_is_recorded_in_the_benchmark_log():
    """The page quotes the log; a figure typed only into the page (or changed there alone) is not a measurement."""
    recorded = set(FIGURE.findall(LOG.read_text(encoding="utf-8")))
    unrecorded = sorted({f for f in FIGURE.findall(PERFORMANCE.read_text(encoding="utf-8")) if f not in recorded})
    assert not unrecorded, f"figures on docs/performance.md that docs/benchmarks/log.md does not record: {unrecorded}"
