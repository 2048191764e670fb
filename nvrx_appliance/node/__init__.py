"""What runs once per node inside the job (nvrx-entrypoint, started by srun): detect the
fabric, publish or gate on the rendezvous, run ft_launcher supervised, watch the control
directory, answer NVRx's node health check, and end the generation's part on this node."""
