"""Survive: checkpoints (checkpoint, ckpt_index), resume checks (resume), the optimizer-boundary
agreement of all ranks (boundary), signals (signals), non-finite skips and halts (nonfinite), and the
relaunching supervisor (supervisor)."""
