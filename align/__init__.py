"""align: Hydra-composed LLM post-training that records what it resolved to."""

__version__ = "0.1.0"
