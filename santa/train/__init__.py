"""Training: the streaming input pipeline, the per-worker loop and checkpoints."""
