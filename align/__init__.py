"""align: Hydra-composed LLM post-training that records what it resolved to."""

from align.core.quiet import install as _install_log_filters

__version__ = "0.1.0"

_install_log_filters()  # before any entry point imports torch or transformers (align/core/quiet.py says why)
