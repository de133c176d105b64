"""`python -m align.tools.preflight [overrides]` (align/tools/preflight/__init__.py)."""

from align.tools.preflight import main

if __name__ == "__main__":
    raise SystemExit(main())
