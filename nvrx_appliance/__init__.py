"""nvrx-appliance: fault-tolerant Megatron training on Slurm around NVRx's ft_launcher.

"The reference deployment", in the code's comments, is the one this package grew from:
the Slurm deployment NVRx ships in its repository (examples/fault_tolerance/deployment:
a generation sbatch, submit_chain.sh, nvrx_watch). Its NVRX_* environment names are
read here too, and where this package departs from it, the comment says why.
"""

__version__ = "0.1.0"

# The contract between the host tool (which writes run.json and the sbatch) and the
# entrypoint baked into an image. Bump it whenever either side changes what it reads
# from the other; submit refuses an image whose entrypoint speaks another protocol.
# 2: the closed flag and the no-restart witness are key=value lines (the batch script
# greps them), no longer JSON.
# 3: peers take the array throttle from task 0's record (the sbatch exports it to task 0
# only), and the sbatch acts on the entrypoint's relay claim.
# 4: the built-in trainer moved (run.json's workload argv names it with -m: an image from
# before the move holds no such module); an image records the trainer it holds.
ENTRYPOINT_PROTOCOL = 4
