"""`python -m align.preflight [overrides]`: the same command as `python -m align.tools.preflight`, beside
`align.train` and `align.eval`."""

from align.tools.preflight import main

if __name__ == "__main__":
    raise SystemExit(main())
