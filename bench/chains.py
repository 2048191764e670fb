"""The chain every cluster scenario submits: one shape, small and quick settings."""

from __future__ import annotations

# One training task, one hot spare, one cold spare: the smallest chain that has every
# role (task 0, a hot spare NVRx keeps warm, a cold spare behind the throttle), on
# 2 of the cluster's 4 nodes at a time. Array 0-2%2.
TRAIN_TASKS, HOT_SPARES, COLD_SPARES = 1, 1, 1
ARRAY_SIZE = TRAIN_TASKS + HOT_SPARES + COLD_SPARES
WORKERS_PER_NODE = 2
SHAPE = (
    "--train-tasks", str(TRAIN_TASKS), "--hot-spares", str(HOT_SPARES),
    "--cold-spares", str(COLD_SPARES), "--gpus-per-node", str(WORKERS_PER_NODE),
)  # fmt: skip

# Timeouts short enough that a lost node costs seconds, not the production minutes;
# the lease goes stale after 10 s (refreshed every ~1.7 s), so a peer of a dead task 0
# leaves about when Slurm declares the node dead. Checkpoints every 5 iterations, all
# kept, so the one a restore read is still on disk to be timed.
FAST = (
    "--workload", "cpu", "--runtime", "bare", "--segment", "off",
    "--save-interval", "5", "--save-retention", "0", "--time", "00:10:00",
    "--setup-timeout", "120", "--step-timeout", "30", "--checkpointing-timeout", "60",
    "--out-of-section-timeout", "60", "--join-timeout", "90", "--store-connect-wait", "30",
    "--rdzv-host-wait", "60", "--lease-stale-after", "10",
)  # fmt: skip

# A generation's first training step, from submit or from the previous one's end, with
# room for a busy 2-core machine.
START_TIMEOUT_S = 240
