"""The hang rule: from every rank's last stack, name the node a hang waits on, or nobody.

A collective hang shows itself in the stacks: the ranks that are fine sit inside a
collective (torch.distributed's all_reduce, barrier, ...) waiting for a peer, and the
peer is elsewhere, in its own code, not moving. The rule names a node only when that
picture is clear (docs/hangs.md says it in words):

1. every rank of the cycle's world has a stack on record, taken shortly before the
   judgement (a rank without one could be the culprit: nobody is named);
2. no rank is in a checkpoint save or load, the data loader or a file-system call:
   those stall every rank alike when the shared file system does, and which node is
   slow cannot be told from the stacks (a stopped rank, state T, is not held by the
   file system wherever its frame: the stop caught it there);
3. some ranks wait in a collective and the others (the outliers) are not in one; a
   stopped rank (state T), or one in an uninterruptible call (D), never waits, whatever
   its frame;
4. the outliers are all on one node (in segment mode: one NVLink domain, whose
   outlier nodes are named), and ranks on at least one other node wait;
5. at least as many ranks wait as are outliers (two nodes with a rank each: the one
   waiting is waiting for the other);
6. both sides stood still: each outlier's stack and each waiting rank's stack has been
   the same for at least `still_s`, so a slow step is not taken for a hang.

Anything else is "no verdict", with the reason, and the stacks are kept all the same.
A wrong blame costs a healthy node; a missed one costs one more restart.

Pure: no I/O, no clock (the judgement's time is an argument).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# torch.distributed's collectives and point-to-point calls, as their Python frames are
# named (torch/distributed/distributed_c10d.py): a rank inside one waits for its peers.
COLLECTIVES = frozenset(
    {
        "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor",
        "all_gather_object", "all_gather_coalesced", "_all_gather_base", "reduce_scatter",
        "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all", "all_to_all_single",
        "broadcast", "broadcast_object_list", "reduce", "gather", "gather_object", "scatter",
        "scatter_object_list", "barrier", "monitored_barrier", "send", "recv", "isend",
        "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list", "wait",
        # a cycle's start-up: the group is formed only when every rank has come
        "init_process_group", "new_group",
    }
)  # fmt: skip
# Of those, the calls that form a process group: no collective completes before them.
FORMING = frozenset({"init_process_group", "new_group"})
DISTRIBUTED_FILES = ("torch/distributed/",)
# A native frame of these waits on a collective of PyTorch's c10d (py-spy --native, taken
# of a blocked rank), and what a person calls it.
NATIVE_WAITS = ("c10d::", "gloo::", "ncclGroupEnd", "ProcessGroupNCCL")
NATIVE_NAMES = {"Reducer::finalize_backward": "all_reduce"}  # DDP's gradient reduction
# /proc states of a rank that cannot be waiting for its peers: stopped, traced, or in an
# uninterruptible call (a gloo or NCCL wait sleeps in S, or spins in R).
NOT_WAITING_STATES = frozenset({"T", "t", "D"})
STOPPED_STATES = frozenset({"T", "t"})  # stopped or traced
# Library code a stopped rank may stand in; its words name the workload's frame instead.
LIBRARY_FILES = ("torch/", "numpy/", "<frozen ", "threading.py")
# Frames that say a checkpoint, the data or the file system holds the rank: a stall
# there is every rank's (the shared file system), never evidence against one node.
CHECKPOINT_MARKS = ("checkpoint", "dist_checkpointing", "serialization.py")
DATA_MARKS = ("torch/utils/data/", "dataloader", "data_loader", "dataset")
FILE_SYSTEM_FILES = frozenset({"pathlib.py", "shutil.py", "tempfile.py", "os.py", "genericpath.py"})
# Words of a function's name (split at "_") that say it reads or writes.
IO_WORDS = frozenset({"save", "load", "fsync", "flush", "write", "read", "checkpoint", "batch"})


@dataclass(frozen=True)
class Frame:
    name: str  # the function
    file: str  # its file, as the sampler read it
    line: int = 0

    def words(self) -> str:
        return f"{self.name} ({self.file}:{self.line})"


@dataclass(frozen=True)
class RankStack:
    """One rank's last stack, as its guard's sampler recorded it."""

    rank: int
    node: str
    frames: tuple[Frame, ...]  # innermost first
    taken: float  # when the sample was taken (epoch seconds)
    still_since: float  # since when the stack has been this one (epoch seconds)
    domain: str = ""  # the node's NVLink domain in segment mode; "" otherwise
    state: str = ""  # the process's state letter when sampled (R, S, D, T, ...)
    native: tuple[str, ...] = ()  # its native frames while it stood still, innermost first
    wchan: str = ""  # in state D, where the kernel keeps it (/proc/<pid>/wchan); "" unknown
    # since when its frames read the same, whatever its CPU (None: not recorded)
    same_since: float | None = None


@dataclass(frozen=True)
class Group:
    """Ranks whose stacks read the same, for a person: where they were, and who."""

    where: str  # the innermost frame that says it (a collective's name, or the rank's own)
    waiting: bool  # inside a collective
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class Judgement:
    nodes: tuple[str, ...]  # the hung node(s); () for no verdict
    words: str  # the verdict, or why there is none
    groups: tuple[Group, ...] = field(default=())
    # "hung" (a node named), "workload" (the workload's own stall: no node), "" (none)
    kind: str = ""
    # The workload's stall: {node: [its ranks that held the others]} (stall_rule.py)
    stalled: dict[str, list[int]] = field(default_factory=dict)
    # A hung node's ranks that held the others: {node: [ranks]}; only these, seen moving
    # again, withdraw the verdict (rank/stacks.py)
    held: dict[str, list[int]] = field(default_factory=dict)
    flight: tuple[str, ...] = ()  # what the flight recorder said, for the record

    @property
    def verdict(self) -> bool:
        return bool(self.nodes)


def _short(name: str) -> str:
    """py-spy qualifies a nested function (`_exception_logger.<locals>.wrapper`)."""
    return name.rsplit(".", 1)[-1]


def _is_distributed(frame: Frame) -> bool:
    return any(mark in frame.file for mark in DISTRIBUTED_FILES)


def collective(stack: RankStack) -> Frame | None:
    """The torch.distributed collective this rank waits in (the outermost such frame:
    the call the workload made), or, where the wait is in C++ (DDP's gradient all-reduce
    inside backward), the c10d frame its native stack waits in; None if neither."""
    found = None
    for frame in stack.frames:
        if _short(frame.name) in COLLECTIVES and _is_distributed(frame):
            found = frame
    if found is not None:
        return found
    waits = [_native_short(n) for n in stack.native if any(mark in n for mark in NATIVE_WAITS)]
    if not waits:
        return None
    # The frame that says which collective: the generic Work::wait sits under DDP's
    # Reducer::finalize_backward (its gradient all-reduce) or c10d::broadcast_coalesced
    # (its buffers' broadcast); else the innermost wait.
    named = next((NATIVE_NAMES[n] for n in waits if n in NATIVE_NAMES), None)
    which = next((n for n in waits if not n.lower().endswith("wait")), None)
    return Frame(named or which or waits[0], "(native)")


def waits_in(stack: RankStack) -> Frame | None:
    """The collective a rank waits in; never for a rank that is stopped (state T) or in
    an uninterruptible call (D, as in a driver call): whatever its frame, such a rank
    holds the others, it does not wait for them."""
    return None if stack.state in NOT_WAITING_STATES else collective(stack)


def _native_short(name: str) -> str:
    """`c10d::Reducer::finalize_backward()` -> `Reducer::finalize_backward`."""
    return name.split("(", 1)[0].removeprefix("c10d::")


def io_frame(stack: RankStack) -> Frame | None:
    """A frame of a checkpoint save or load, the data loader or the file system."""
    for frame in stack.frames:
        where = frame.file.lower()
        words = set(_short(frame.name).lower().strip("_").split("_"))
        if any(mark in where for mark in CHECKPOINT_MARKS + DATA_MARKS):
            return frame
        if where.rsplit("/", 1)[-1] in FILE_SYSTEM_FILES or words & IO_WORDS:
            return frame
    return None


def own_frame(stack: RankStack) -> Frame | None:
    """Where a rank outside any collective stands, in the workload's own code: its
    innermost frame outside PyTorch and the interpreter (else its innermost)."""
    for frame in stack.frames:
        if not frame.file.startswith(LIBRARY_FILES):
            return frame
    return stack.frames[0] if stack.frames else None


def groups(stacks: Sequence[RankStack]) -> tuple[Group, ...]:
    """The stacks grouped by where they stand (waiting groups first, then by size)."""
    keyed: dict[tuple[str, bool], list[RankStack]] = {}
    for stack in stacks:
        waiting_in = waits_in(stack)
        here = waiting_in or own_frame(stack)
        key = (here.name if here else "(no Python frame)", waiting_in is not None)
        keyed.setdefault(key, []).append(stack)
    found = [
        Group(
            where=where,
            waiting=waiting,
            ranks=tuple(sorted(s.rank for s in members)),
            nodes=tuple(sorted({s.node for s in members})),
            frames=members[0].frames,
        )
        for (where, waiting), members in keyed.items()
    ]
    return tuple(sorted(found, key=lambda g: (not g.waiting, -len(g.ranks), g.where)))


def _ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"


def judge(
    stacks: Sequence[RankStack],
    *,
    world_size: int,
    cycle: int,
    now: float,
    fresh_s: float,
    still_s: float,
    segment: bool = False,
) -> Judgement:
    """Name the node(s) the hang waits on, or none, by the rule of this module's doc."""
    grouped = groups(stacks)

    def none(why: str) -> Judgement:
        return Judgement((), f"no verdict in cycle {cycle}: {why}", grouped)

    present = {s.rank for s in stacks}
    if len(present) < world_size:
        return none(
            f"stacks of {len(present)} of the {world_size} ranks on record; a rank without "
            "one could be the cause"
        )
    stale = sorted(s.rank for s in stacks if now - s.taken > fresh_s)
    if stale:
        return none(f"the last stacks of rank(s) {_list(stale)} are older than {fresh_s:.0f} s")
    for stack in stacks:
        # A stopped rank stands wherever the stop caught it (importlib's `_load_unlocked`
        # at a cycle's start-up reads as I/O): its frame says nothing of the file system.
        frame = io_frame(stack) if stack.state not in STOPPED_STATES else None
        if frame is not None:
            return none(
                f"rank {stack.rank} on {stack.node} was in `{frame.name}` ({frame.file}): a "
                "checkpoint, the data or the file system held the ranks, which is no one "
                "node's to answer for"
            )
    waiting = [s for s in stacks if waits_in(s) is not None]
    outliers = [s for s in stacks if waits_in(s) is None]
    if not waiting:
        return none("no rank waited in a collective: every rank stopped in its own code")
    if not outliers:
        return none(
            "every rank waited in a collective: the stacks do not say which one holds the "
            "others (on GPUs, NCCL's flight recorder can)"
        )
    where = {(s.domain or s.node) if segment else s.node for s in outliers}
    if len(where) > 1:
        return none(
            f"the {_ranks(len(outliers))} outside a collective are on {len(where)} "
            f"{'NVLink domains' if segment else 'nodes'} ({_list(sorted(where))}): no single outlier"
        )
    culprits = sorted({s.node for s in outliers})
    elsewhere = [s for s in waiting if s.node not in culprits]
    if not elsewhere:
        return none("no rank on another node waited for the outliers")
    if len(waiting) < len(outliers):
        return none(
            f"only {_ranks(len(waiting))} waited in a collective against "
            f"{_ranks(len(outliers))} outside one: not the picture of one node holding the rest"
        )
    moving = sorted(s.rank for s in stacks if now - s.still_since < still_s)
    if moving:
        return none(
            f"rank(s) {_list(moving)} had been where they were for less than {still_s:.0f} s: "
            "still moving, not hung"
        )
    return Judgement(tuple(culprits), hung_words(culprits, outliers, waiting, cycle), grouped)


def hung_words(
    culprits: Sequence[str],
    outliers: Sequence[RankStack],
    waiting: Sequence[RankStack],
    cycle: int,
) -> str:
    """ "node3 hung in cycle 2: its 2 ranks stopped in `train_step` while the 4 others
    waited in `all_reduce`"."""
    stopped = sorted({f.name for s in outliers if (f := own_frame(s)) is not None})
    waits = sorted({f.name for s in waiting if (f := waits_in(s)) is not None})
    its = "its" if len(culprits) == 1 else "their"
    return (
        f"{' and '.join(culprits)} hung in cycle {cycle}: {its} {_ranks(len(outliers))} "
        f"stopped in {_names(stopped)} while the {len(waiting)} other"
        f"{'' if len(waiting) == 1 else 's'} waited in {_names(waits)}"
    )


def _names(names: Sequence[str]) -> str:
    return " / ".join(f"`{n}`" for n in names) or "an unknown place"


def _list(items: Sequence[object]) -> str:
    return ", ".join(str(i) for i in items)
