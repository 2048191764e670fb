"""What a worker's exit means, from its exit code, the chain's exit table and the last
lines it wrote. Pure: the workload guard (guard.py) feeds it and acts on the answer.

Three things are told apart:

- a checkpoint that could not be loaded. Only on evidence, never because a worker died
  early (a bad GPU or an import error also kills a worker before its first step, and
  setting a good checkpoint aside for that would lose training): the workload contract's
  line `NVRX_APPLIANCE_LOAD_FAILED iteration=N` (docs/workload-contract.md; the built-in
  trainer prints it), Megatron's own "could not load the checkpoint" (its legacy format,
  which then exits 0), or a checkpoint read error after Megatron's "loading ...
  checkpoint from DIR at iteration N" and before its "successfully loaded checkpoint";
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
# print_rank_0(f' loading {dist_infix}checkpoint from {load_dir} at iteration {iteration}')
_MEGATRON_LOADING = re.compile(r"\bloading (?:distributed )?checkpoint from \S+ at iteration (\d+)")
_MEGATRON_LOADED = re.compile(r"\bsuccessfully loaded checkpoint from \S+ .*at iteration (\d+)")
_MEGATRON_LEGACY_FAILED = "could not load the checkpoint"
# What a checkpoint that is torn, truncated or missing a file raises while it is read:
# torch's zip reader, pickle, the distributed checkpoint reader, Megatron's own checks.
_READ_ERRORS = (
    "PytorchStreamReader failed",
    "failed finding central directory",
    "UnpicklingError",
    "Ran out of input",
    "unexpected EOF",
    "EOFError",
    "CheckpointingException",
    "integrity verification failed",
    "_pickle.UnpicklingError",
    "CheckpointException",
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
    """A line that says something about loading a checkpoint: kept whatever else the
    workload writes after it (a traceback of every rank can push it out of a tail)."""
    return (
        LOAD_FAILED_MARK in line
        or _MEGATRON_LEGACY_FAILED in line
        or bool(_MEGATRON_LOADING.search(line) or _MEGATRON_LOADED.search(line))
    )


def load_failure(lines: Iterable[str], code: int) -> LoadFailure | None:
    """The evidence, in a worker's last lines, that it could not load a checkpoint."""
    loading: int | None = None
    loaded = False
    read_error = ""
    for line in lines:
        if LOAD_FAILED_MARK in line:
            match = _CONTRACT.search(line)
            return LoadFailure(int(match.group(1)) if match else None, _quote(line))
        if _MEGATRON_LEGACY_FAILED in line:
            return LoadFailure(loading, _quote(line))
        if match := _MEGATRON_LOADING.search(line):
            loading, loaded, read_error = int(match.group(1)), False, ""
        elif _MEGATRON_LOADED.search(line):
            loaded = True
        elif not read_error and any(sign in line for sign in _READ_ERRORS):
            read_error = line
    if code != 0 and read_error and not loaded:
        # Megatron prints the loading line on rank 0 only: a rank that raised while
        # reading its shard counts as well, its own error line being the evidence.
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


def judge(code: int, table: Mapping[str, str], workload: str, lines: Iterable[str]) -> Exit | None:
    """How the chain must read a worker that exited `code` (after it wrote `lines`, oldest
    first); None for a clean exit that loaded what it was asked to."""
    seen = list(lines)
    failure = load_failure(seen, code)
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
