"""Host side on Slurm: the sbatch template, the Slurm CLI adapter, submit, teardown, ledger."""
