"""Data: sources -> chat records -> encoded token arrays with loss masks -> micro-batches."""
