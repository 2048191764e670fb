"""What a worker's exit means, from its exit code, the chain's exit table and the last
lines it wrote. Pure: the workload guard (guard.py) feeds it and acts on the answer.

Three things are told apart:

- a checkpoint that could not be loaded. Only on evidence, never because a worker died
  early (a bad GPU or an import error also kills a worker before its first step, and
  setting a good checkpoint aside for that would lose training): the workload contract's
  line `NVRX_APPLIANCE_LOAD_FAILED iteration=N` (docs/workload-contract.md; the built-in
  trainer prints it), Megatron's own "could not load the checkpoint" (its legacy format,
  which then exits 0), or, on rank 0 only, a checkpoint read error inside its loading
  window (load_failure says which lines open and close it);
- a verdict: an exit code the table maps to resume-elsewhere or stop-chain;
- anything else: an ordinary failure, which NVRx restarts in place.

The lines recognised are Megatron's at the pinned commit (megatron/training/
checkpointing.py and megatron/core/rerun_state_machine.py); tests hold recorded copies.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nvrx_appliance.checkpoints.checkpoint_dir import LOAD_FAILED_MARK
from nvrx_appliance.settings import exit_actions

_CONTRACT = re.compile(LOAD_FAILED_MARK + r"\s+iteration=(\d+)")
# Every line of Megatron's about a checkpoint says "checkpoint": the one substring test a
# line that says nothing of the kind (nearly all of them) costs before any expression.
_CHECKPOINT_WORD = "checkpoint"
# print_rank_0(f' loading {dist_infix}checkpoint from {load_dir} at iteration {iteration}')
_MEGATRON_LOADING = re.compile(r"\bloading (?:distributed )?checkpoint from \S+ at iteration (\d+)")
_MEGATRON_LOADED = re.compile(r"\bsuccessfully loaded checkpoint from \S+ .*at iteration (\d+)")
# print_rank_0(f'[{time}] saving checkpoint at iteration {iteration:7d} to {save_dir} in ...')
_MEGATRON_SAVING = re.compile(r"\bsaving checkpoint at iteration\s+(\d+) to ")
_MEGATRON_LEGACY_FAILED = "could not load the checkpoint"
# Raised on every rank before the loading line is printed (_get_checkpoint_format): the
# tracked checkpoint missing whole (FileNotFoundError from listing its directory), or
# holding no format Megatron knows (no metadata.json: NotImplementedError "unknown
# checkpoint format in DIR/iter_0000040").
_UNKNOWN_FORMAT = re.compile(r"unknown checkpoint format in \S*\biter_(\d{7,})")
_MISSING = re.compile(r"FileNotFoundError\b.*\biter_(\d{7,})")
# What a checkpoint that is torn, truncated or missing a file raises while it is read:
# torch's zip reader, pickle, the distributed checkpoint reader, Megatron's own checks.
# Each of them is also what a data loader (EOFError), a save (CheckpointException on a
# full quota) or a missing data file can raise: a sign counts only inside the loading
# window (load_failure says which).
_READ_ERRORS = (
    "PytorchStreamReader failed",
    "failed finding central directory",
    "UnpicklingError",
    "Ran out of input",
    "unexpected EOF",
    "EOFError",
    "CheckpointingException",
    "integrity verification failed",
    "CheckpointException",
    "FileNotFoundError",
)
# Megatron's training line: " iteration       60/    1000 | consumed samples: ..."; the
# built-in trainer's: "iteration 60/300 | loss ..."; a script's, as it likes to say it:
# the last iteration a line names is the one the workload reached.
_TRAINING_ITERATION = re.compile(r"\biteration\s+(\d+)\b")
# The rerun state machine names the iteration as "iteration #60".
_RERUN_ITERATION = re.compile(r"\biteration #(\d+)")
_RERUN_LINES = (
    "Unexpected result",
    "First rerun",
    "Second rerun",
    "Possible transient error",
    "Possible persistent error",
    "Correct result",
    "Got rescheduled",
    "Exiting now",
    "Saving a checkpoint and exiting now",
)
# glog-style notices of the libraries under the workload (torch's c10d, NCCL's): what
# they say is rarely why the workload exited.
_NOTICE = re.compile(r"^(?:\d+: )?\[[IW]\d{4} ")
_ERROR = re.compile(r"\b\w*(?:Error|Exception)\b:")
MAX_LINE_CHARS = 400  # a quoted line, in the ledger and status


@dataclass(frozen=True)
class LoadFailure:
    iteration: int | None  # the one that failed; None: the tracked one, as read at start
    line: str  # the line that says so


@dataclass(frozen=True)
class Exit:
    """One worker's exit, as the chain must read it."""

    code: int
    action: str  # exit_actions.RESTART, RESUME_ELSEWHERE or STOP_CHAIN
    meaning: str
    iteration: int | None  # the last one the workload reported, or the verdict's
    line: str  # the last line that explains it ("" when none does)
    load_failure: LoadFailure | None = None


def is_load_line(line: str) -> bool:
    """A line that says something about loading (or saving) a checkpoint: kept whatever
    else the workload writes after it (a traceback of every rank can push it out of a
    tail). The guard asks this of every line: two substring tests for a line that says
    nothing of the kind."""
    if LOAD_FAILED_MARK in line:
        return True
    if _CHECKPOINT_WORD not in line:
        return False
    return _MEGATRON_LEGACY_FAILED in line or bool(
        _MEGATRON_LOADING.search(line)
        or _MEGATRON_LOADED.search(line)
        or _MEGATRON_SAVING.search(line)
    )


def load_failure(
    lines: Iterable[str], code: int, *, rank0: bool = True, tracked: int | None = None
) -> LoadFailure | None:
    """The evidence, in a worker's last lines (this cycle's: a guard lives one cycle), that
    it could not load a checkpoint. `rank0`: the worker is global rank 0, the one rank on
    which Megatron prints its loading lines; `tracked`: the iteration the tracker named
    when the worker started.

    Explicit words count on any rank: the contract line, Megatron's legacy "could not
    load the checkpoint". A read error counts only on rank 0 and only inside the loading
    window: after "loading ... checkpoint ... at iteration N" and before "successfully
    loaded", a save, or a training line past N. Anywhere else the same error is the
    workload's (a data loader's EOFError, a save's CheckpointException), never the
    checkpoint's; on another rank, without Megatron's lines, nothing tells the two apart,
    so rank 0 decides for all of them. Before the window, rank 0's "unknown checkpoint
    format" or FileNotFoundError naming the tracked checkpoint's directory counts (the
    checkpoint missing whole, or its metadata), as long as nothing was trained or saved."""
    loading: int | None = None
    window = False  # between the loading line and the end of the load
    worked = False  # trained or saved before any loading line: past the load
    read_error = ""
    for line in lines:
        if LOAD_FAILED_MARK in line:
            match = _CONTRACT.search(line)
            return LoadFailure(int(match.group(1)) if match else None, _quote(line))
        if _MEGATRON_LEGACY_FAILED in line:
            return LoadFailure(loading, _quote(line))
        if not rank0:
            continue
        if _CHECKPOINT_WORD in line:
            if match := _MEGATRON_LOADING.search(line):
                loading, window, read_error = int(match.group(1)), True, ""
                continue
            if _MEGATRON_LOADED.search(line) or _MEGATRON_SAVING.search(line):
                window, read_error = False, ""
                worked = worked or loading is None
                continue
        if window:
            match = _TRAINING_ITERATION.search(line)
            if match and loading is not None and int(match.group(1)) > loading:
                window, read_error = False, ""  # trained past the checkpoint it loaded
            elif not read_error and any(sign in line for sign in _READ_ERRORS):
                read_error = line
        elif loading is None and not worked:
            missing = _UNKNOWN_FORMAT.search(line) or _MISSING.search(line)
            if missing and (tracked is None or int(missing.group(1)) == tracked):
                return LoadFailure(int(missing.group(1)), _quote(line)) if code != 0 else None
            worked = worked or bool(_TRAINING_ITERATION.search(line))
    if code != 0 and window and read_error:
        return LoadFailure(loading, _quote(read_error))
    return None


def last_iteration(lines: Iterable[str]) -> int | None:
    found = None
    for line in lines:
        match = _TRAINING_ITERATION.search(line) or _RERUN_ITERATION.search(line)
        if match:
            found = int(match.group(1))
    return found


def explaining_line(lines: Iterable[str]) -> str:
    """The last line that says why the workload stopped: the rerun state machine's, else
    an error's (a traceback's last line), else the last line the workload wrote that is
    not a library's warning or notice (torch's "[W1203 09:48:46 socket.cpp:207] ...")."""
    rerun, error, last = "", "", ""
    for line in lines:
        text = line.strip()
        if not text or _NOTICE.match(text) or "Warning:" in text:
            continue
        if any(mark in text for mark in _RERUN_LINES):
            rerun = text
        if _ERROR.search(text):
            error = text
        last = text
    return _quote(rerun or error or last)


def judge(
    code: int,
    table: Mapping[str, str],
    workload: str,
    lines: Iterable[str],
    *,
    rank0: bool = True,
    tracked: int | None = None,
) -> Exit | None:
    """How the chain must read a worker that exited `code` (after it wrote `lines`, oldest
    first); None for a clean exit that loaded what it was asked to. `rank0` and
    `tracked`: load_failure's."""
    seen = list(lines)
    failure = load_failure(seen, code, rank0=rank0, tracked=tracked)
    if code == 0 and failure is None:
        return None
    action = table.get(str(code), exit_actions.RESTART)
    rerun = [line for line in seen if _RERUN_ITERATION.search(line)]
    iteration = last_iteration(rerun) if rerun else last_iteration(seen)
    return Exit(
        code=code,
        action=action,
        meaning=exit_actions.meaning(code, action, workload),
        iteration=iteration,
        line=failure.line if failure else explaining_line(seen),
        load_failure=failure,
    )


def _quote(line: str) -> str:
    line = line.strip()
    return line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 3] + "..."


def describe(exit: Exit) -> str:
    """The exit in one line a person reads."""
    where = f" at iteration {exit.iteration}" if exit.iteration is not None else ""
    return f"exit {exit.code}{where}: {exit.meaning}"
