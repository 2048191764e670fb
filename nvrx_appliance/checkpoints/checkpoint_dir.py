"""Names in the checkpoint directory, the tracker's content, and retention. Pure.

Megatron's layout: <save>/iter_0000020/ per checkpoint and
<save>/latest_checkpointed_iteration.txt holding the iteration of the newest complete
one. The cpu trainer writes a checkpoint under a hidden partial name and renames it to
its iter_ name only once every rank has written, then moves the tracker; so an iter_
directory is always complete, and the tracker never names a partial one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_ITER = re.compile(r"^iter_(\d{7,})$")
# The workload contract's line for "the checkpoint I was told to resume from cannot be
# loaded" (docs/workload-contract.md), followed by `iteration=N`; the rank's guard reads it.
LOAD_FAILED_MARK = "NVRX_APPLIANCE_LOAD_FAILED"


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


def expired(iterations: Iterable[int], latest: int, keep: int) -> list[int]:
    """Checkpoints to delete once `latest` is tracked, keeping the newest `keep` (0: all).

    Anything newer than `latest` is from a timeline that was abandoned when training
    resumed from an older checkpoint, and goes too; `latest` itself never does.
    """
    found = sorted(set(iterations))
    abandoned = [i for i in found if i > latest]
    kept_line = [i for i in found if i <= latest]
    if keep <= 0:
        return abandoned
    old = [i for i in kept_line[:-keep] if i != latest] if len(kept_line) > keep else []
    return sorted(old + abandoned)


def retired(iterations: Iterable[int], tracked: int, keep: int) -> list[int]:
    """Checkpoints a keeper outside the workload may remove: those older than the tracked
    one beyond the newest `keep` up to it (0: none). Never the tracked one, and never a
    newer one, which may be a save still being written."""
    if keep <= 0:
        return []
    line = sorted(i for i in set(iterations) if i <= tracked)
    if tracked not in line:
        line.append(tracked)  # the tracked one always counts among those kept
    return [i for i in line[:-keep] if i != tracked]
