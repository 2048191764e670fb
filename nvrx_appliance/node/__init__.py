"""In-container side: what srun starts on every node (detect, gate, launch, supervise)."""
