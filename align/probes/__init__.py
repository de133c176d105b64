"""Triage probes: each measures the composed run, reusing the trainer (playbook 1-3)."""
