"""What a run tells about itself while it runs: history.jsonl, W&B, the progress bar, throughput."""
