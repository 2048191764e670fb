"""The chain on Slurm, host side: submit (plan, lock, queue, roll back), the generation's
sbatch template (the host code it runs, task 0's teardown, lives in jobhost/), status,
logs and cancel. Slurm is read through observe/slurmcli.py, the one Slurm adapter; the
calls that change the queue (sbatch, scancel) are job_control.py's, through its runner."""
