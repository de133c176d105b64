"""The trainer's side jobs, one callback each (align/callbacks/callback.py: the hooks)."""

from __future__ import annotations

from align.callbacks.callback import Callback, Callbacks

__all__ = ["Callback", "Callbacks"]
