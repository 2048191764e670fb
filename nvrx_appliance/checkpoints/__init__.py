"""What works on the checkpoint directory: its names and the tracker's text, retention of
the newest complete checkpoints, and the fall-back from one that cannot be loaded."""
