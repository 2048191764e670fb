"""What runs once per rank, between ft_launcher and the workload: the guard that passes
the workload's output through and judges its exit (a failed load, a verdict)."""
