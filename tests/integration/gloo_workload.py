"""A small gloo workload for ft_launcher on the local cluster (run by each worker).

Usage: gloo_workload.py RECORD_DIR FAULTY_RANK

Every rank joins the process group, all-reduces a few times and writes one JSON record
of where and in which cycle it ran. FAULTY_RANK exits 1 the first time it runs (the
fault marker file makes it once per job, across cycles), which ft_launcher must answer
with an in-job restart.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist

STEPS = 3


def main() -> int:
    records, faulty = Path(sys.argv[1]), int(sys.argv[2])
    rank = int(os.environ["RANK"])
    cycle = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    record = {
        "rank": rank,
        "cycle": cycle,
        "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }
    if rank == faulty:
        try:
            fd = os.open(records / "fault.marker", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.close(fd)
            (records / f"fault.{cycle}.json").write_text(json.dumps(record))
            return 1
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    total = torch.zeros(1)
    for _ in range(STEPS):
        value = torch.ones(1)
        dist.all_reduce(value)
        total += value
    dist.destroy_process_group()
    record.update(world=world, total=float(total.item()))
    (records / f"done.{cycle}.{rank}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
