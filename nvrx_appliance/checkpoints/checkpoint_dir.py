"""Names in the checkpoint directory, the tracker's content, and retention. Pure, but for
problem_at(), which looks at the directory itself.

Megatron's layout: <save>/iter_0000020/ per checkpoint and
<save>/latest_checkpointed_iteration.txt holding the iteration of the newest complete
one. The cpu trainer writes a checkpoint under a hidden partial name and renames it to
its iter_ name only once every rank has written, then moves the tracker; so an iter_
directory is always complete, and the tracker never names a partial one.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

_ITER = re.compile(r"^iter_(\d{7,})$")
# The workload contract's line for "the checkpoint I was told to resume from cannot be
# loaded" (docs/workload-contract.md), followed by `iteration=N`; the rank's guard reads it.
LOAD_FAILED_MARK = "NVRX_APPLIANCE_LOAD_FAILED"


# Megatron's and the built-in trainer's iter_NNNNNNN directories, and a script's
# checkpoint files of the same name with an extension (iter_0000040.pt).
_CHECKPOINT = re.compile(r"^iter_(\d{7,})(\.[A-Za-z0-9]+)?$")


def checkpoint_name(name: str) -> int | None:
    """The iteration of a checkpoint's name, directory or file; None for anything else."""
    match = _CHECKPOINT.match(name)
    return int(match.group(1)) if match else None


def directory_problem(path: str, *, mode: int, owner: int, uid: int, is_dir: bool) -> str | None:
    """Why the checkpoint directory must not be trusted, or None. Pure. Whoever can write
    into it can plant an iter_ checkpoint (torch loads it with pickle: code run as the
    job's user) that a fall-back would point the tracker at, or rewrite the tracker."""
    if not is_dir:
        return f"checkpoint directory {path} is not a directory"
    if owner != uid:
        return (
            f"checkpoint directory {path} is owned by uid {owner}, not by this job's user "
            f"(uid {uid}); give the chain a work dir of its own (--work-dir)"
        )
    if mode & 0o022:
        return (
            f"checkpoint directory {path} is group- or world-writable (mode "
            f"{mode & 0o777:04o}): another user could plant a checkpoint there; run "
            f"chmod go-w {path}"
        )
    return None


def problem_at(path: Path, uid: int) -> str | None:
    """directory_problem() of the checkpoint directory as it is now, a link followed (the
    checkpoints may live on other storage). The one judgement submit and every generation
    make, so that submit refuses exactly what the job would. None where nothing is there
    yet: the generation creates it owner-only. Other OSErrors are the caller's."""
    try:
        seen = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            return (
                f"checkpoint directory {path} is a link to a path that does not exist; fix the link"
            )
        return None
    return directory_problem(
        str(path), mode=seen.st_mode, owner=seen.st_uid, uid=uid, is_dir=stat.S_ISDIR(seen.st_mode)
    )


def iteration_dir(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def partial_dir(iteration: int) -> str:
    # Hidden and without the iter_ prefix: nothing that lists checkpoints can mistake it.
    return f".partial_iter_{iteration:07d}"


def is_partial_dir(name: str) -> bool:
    return name.startswith(".partial_iter_")


def parse_iteration_dir(name: str) -> int | None:
    match = _ITER.match(name)
    return int(match.group(1)) if match else None


def tracker_text(iteration: int) -> str:
    return f"{iteration}\n"


def expired(iterations: Iterable[int], latest: int, keep: int, complete: set[int]) -> list[int]:
    """Checkpoints to delete once `latest` is tracked, keeping the newest `keep` (0: all)
    of those once complete (retired() says which count).

    Anything newer than `latest` is from a timeline that was abandoned when training
    resumed from an older checkpoint, and goes too; `latest` itself never does.
    """
    abandoned = sorted(i for i in set(iterations) if i > latest)
    return sorted(abandoned + retired(iterations, latest, keep, complete))


def retired(iterations: Iterable[int], tracked: int, keep: int, complete: set[int]) -> list[int]:
    """Checkpoints a keeper outside the workload may remove (0: none). Never the tracked
    one, and never a newer one, which may be a save still being written.

    Only checkpoints once complete (`complete`: those the tracker once named, the
    tracked record) count among the newest `keep` up to the tracked one; the older
    complete ones retire. A directory the tracker never named (a save cut short: a
    time-limit save killed by Slurm, a node that died) is neither kept nor counted: it
    is left where it lies among those kept (it might be a complete save nobody saw
    tracked), and removed once it is older than every one kept, when `keep` are."""
    if keep <= 0:
        return []
    found = set(iterations)
    good = sorted({i for i in found if i < tracked and i in complete} | {tracked})
    kept = good[-keep:]
    surplus = good[:-keep]
    if len(kept) == keep:
        surplus += [i for i in found if i < kept[0] and i not in complete]
    return sorted(surplus)
