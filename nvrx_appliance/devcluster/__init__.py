"""The local multi-node Slurm cluster (network namespaces) used by the demo and the tests."""
