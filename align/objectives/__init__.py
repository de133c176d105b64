"""Training objectives: how records become batches and how a micro-batch becomes a loss."""
