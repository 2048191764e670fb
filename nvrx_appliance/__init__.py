"""nvrx-appliance: fault-tolerant Megatron training on Slurm around NVRx's ft_launcher."""

__version__ = "0.1.0"

# The contract between the host tool (which writes run.json and the sbatch) and the
# entrypoint baked into an image. Bump it whenever either side changes what it reads
# from the other; submit refuses an image whose entrypoint speaks another protocol.
ENTRYPOINT_PROTOCOL = 1
