"""Triage probes: each measures the composed run, reusing the trainer."""
