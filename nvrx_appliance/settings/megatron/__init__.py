"""Megatron-LM's arguments: the argv the appliance builds for pretrain_gpt.py (argv.py),
which of its options name paths (paths.py), what a user's Megatron arguments may and
may not say (rules.py), and the parallel shape computed as the pinned Megatron computes
it (parallel.py). Pure."""
