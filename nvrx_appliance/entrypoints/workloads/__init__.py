"""Workloads run under ft_launcher: Megatron-LM pretrain_gpt.py, and a built-in CPU trainer."""
