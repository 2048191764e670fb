"""Save and load the cpu trainer's checkpoints (torch.distributed.checkpoint) safely.

Commit protocol, so a job killed at any instant leaves the tracker on a complete
checkpoint:
  1. every rank writes its shards into <save>/.partial_iter_N/ (DCP fsyncs each file);
  2. barrier: every rank has finished writing;
  3. rank 0 renames the directory to iter_N, then replaces the tracker by rename;
  4. rank 0 prunes: stale partial directories, checkpoints beyond the retention, and
     checkpoints of an abandoned timeline (newer than the tracker).
A kill before 3 leaves a partial directory nobody reads (the next save of that
iteration removes it); a kill between the rename and the tracker leaves a complete
but untracked iter_N, which resumption ignores.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from nvrx_appliance.checkpoints import checkpoint_dir, tracked_record
from nvrx_appliance.files import make_private_dirs, read_text
from nvrx_appliance.layout import TRACKER_FILE, TRAINING_DONE_FILE
from nvrx_appliance.manifest import write_atomic
from nvrx_appliance.observe import run_files


def read_tracker(save_dir: Path) -> int | None:
    text = read_text(save_dir / TRACKER_FILE, 64)
    return None if text is None else run_files.tracker_value(text)


def tracked_iteration(save_dir: Path) -> int | None:
    """Rank 0 reads the tracker and tells everyone, so all ranks load the same checkpoint."""
    box = [read_tracker(save_dir) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def load(save_dir: Path, iteration: int, state: dict[str, Any]) -> None:
    """Fill `state` in place from iter_<iteration>."""
    dcp.load(state, checkpoint_id=save_dir / checkpoint_dir.iteration_dir(iteration))


def save(save_dir: Path, iteration: int, state: dict[str, Any], keep: int) -> None:
    partial = save_dir / checkpoint_dir.partial_dir(iteration)
    final = save_dir / checkpoint_dir.iteration_dir(iteration)
    if dist.get_rank() == 0:
        make_private_dirs(save_dir)
        # Leftovers of a killed attempt at this iteration: never mix their shards in.
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
    dist.barrier()
    dcp.save(state, checkpoint_id=partial)
    dist.barrier()
    if dist.get_rank() == 0:
        os.replace(partial, final)
        _fsync_dir(save_dir)
        write_atomic(save_dir / TRACKER_FILE, checkpoint_dir.tracker_text(iteration))
        # Complete and tracked: the tracked record says so (retention and the fall-back
        # count no other checkpoint).
        tracked_record.append(save_dir / tracked_record.FILE, tracked_record.TRACKED, iteration)
        _prune(save_dir, iteration, keep)
    dist.barrier()


def mark_done(save_dir: Path, iteration: int) -> None:
    """The training-done marker (rank 0, after the final checkpoint is tracked): the
    final iteration in the tracker's format, by rename."""
    write_atomic(save_dir / TRAINING_DONE_FILE, checkpoint_dir.tracker_text(iteration))


def _prune(save_dir: Path, latest: int, keep: int) -> None:
    found: dict[int, Path] = {}
    for entry in save_dir.iterdir():
        if checkpoint_dir.is_partial_dir(entry.name):
            shutil.rmtree(entry, ignore_errors=True)
        elif (n := checkpoint_dir.parse_iteration_dir(entry.name)) is not None:
            found[n] = entry
    record = save_dir / tracked_record.FILE
    for n in checkpoint_dir.expired(found, latest, keep, tracked_record.read(record)):
        shutil.rmtree(found[n], ignore_errors=True)
        tracked_record.append(record, tracked_record.REMOVED, n)


def _fsync_dir(path: Path) -> None:
    # The rename is durable only once the directory entry is; the tracker must not
    # reach the disk before the checkpoint it names.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
