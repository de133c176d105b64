"""Process topology and device placement."""
