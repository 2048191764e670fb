"""Task 0's checkpoint retention on the local cluster while each delete takes seconds
(issue 44): the keeper writes down every checkpoint the tracker names even though
Megatron's saves come faster than retention's deletes, so a fall-back from the newest
finds the one before it; and retention still thins the directory to the newest N.

Two stand-ins, for what this machine lacks: Megatron itself (it needs a GPU), as its
checkpoint writing only (megatron_standin/pretrain_gpt.py, through the real
`--workload megatron --megatron-path`); and a file system on which deleting a
checkpoint takes seconds, as on Lustre (slow_delete.c, preloaded into the job). The
entrypoint, its keeper, ft_launcher and Slurm are the real ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nvrx_appliance.checkpoints import tracked_record

from .chain_support import (
    cli,
    logs_on_failure,
    slow_storage,
    submit,
    unique,
    wait_idle,
    wait_ledger,
)
from .conftest import Cluster

pytestmark = pytest.mark.cluster

STANDIN = Path(__file__).parent / "megatron_standin"  # holds pretrain_gpt.py
SAVE_INTERVAL = 5
SAVES = 6  # megatron_standin/pretrain_gpt.py: one every 2 s
DELETE_S = 5  # each delete: longer than two saves' gap


def test_every_tracked_checkpoint_is_recorded_while_retention_deletes_slowly(cluster: Cluster):
    work, name = cluster.workdir("retention"), unique("retention")
    submit(
        cluster, work, name, "--workload", "megatron", "--megatron-path", str(STANDIN),
        "--train-tasks", "1", "--hot-spares", "0", "--cold-spares", "0", "--depth", "1",
        "--save-interval", str(SAVE_INTERVAL), "--save-retention", "2",
        env=slow_storage(cluster, NVRX_SLOW_DELETE_S=DELETE_S),
    )  # fmt: skip
    try:
        [entry] = wait_ledger(work, 1, timeout=180)
    finally:
        cli(cluster, "cancel", name)
        wait_idle(cluster, name, timeout=90)
    assert entry["exit_code"] == 0, logs_on_failure(work)
    checkpoints = work / "checkpoints"
    saved = [SAVE_INTERVAL * n for n in range(1, SAVES + 1)]
    # Every iteration the tracker named is written down, in order, though the keeper was
    # deleting all the while: a fall-back from 30 goes to 25, not past it.
    record = (checkpoints / tracked_record.FILE).read_text()
    tracked = [n for kind, n in tracked_record.entries(record) if kind == tracked_record.TRACKED]
    assert tracked == saved, (record, logs_on_failure(work))
    # Retention kept the newest two; the older ones are deleted or renamed aside for the
    # next generation's keeper to finish (the generation ended while it deleted).
    on_disk = sorted(p.name for p in checkpoints.glob("iter_*"))
    assert on_disk == [f"iter_{n:07d}" for n in saved[-2:]], on_disk
    removed = [n for kind, n in tracked_record.entries(record) if kind == tracked_record.REMOVED]
    assert removed == saved[:-2], record
    task0 = next((work / "logs").glob("slurm-*_0.out")).read_text()
    assert (
        f"retention (newest 2 kept): removed checkpoint(s) of iteration {SAVE_INTERVAL}" in task0
    ), task0
