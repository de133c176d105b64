"""Entry points besides `align.train` and `align.eval`: `python -m align.tools.<name>` for preflight,
probe, report, annotate, supervise, inspect and docs."""
