"""The chain on Slurm, host side: submit (plan, lock, queue, roll back), the generation's
sbatch template (the host code it runs, task 0's teardown, lives in jobhost/), status,
logs and cancel. The Slurm commands themselves are run and parsed in observe/slurmcli.py,
the one Slurm adapter."""
