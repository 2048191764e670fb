"""What a worker's exit code means to the chain: the workload's table. Pure.

Under ft_launcher every non-zero exit of a worker is a failure that NVRx restarts in
place, on the same GPUs, until its restart or no-progress budget runs out (then 93, and
the chain ends as if NVRx had judged the machines). Some exits are the training's own
verdict, which no restart on the same GPUs can change. The table maps such codes to
one of a small fixed set of actions, which the workload guard (rank/guard.py)
carries out the moment a worker exits with one:

    restart           NVRx restarts the workers in place (what every unlisted code does)
    resume-elsewhere  the generation ends; the next one resumes from the checkpoint,
                      kept off this generation's nodes where the cluster has others.
                      Once per iteration: the same code at the same iteration again
                      stops the chain.
    stop-chain        the chain stops: nothing queued runs, every checkpoint is kept

Megatron's rerun state machine (megatron/core/rerun_state_machine.py at the pin) exits
16 (EXIT_CODE_RESUME_TO_DISAMBIGUATE) after saving a checkpoint, asking to be resumed
from it on other GPUs, and 17 (EXIT_CODE_FAILED_ON_RESULT_VALIDATION) when result
validation failed for good; that is the Megatron (and built-in trainer) default.
"""

from __future__ import annotations

RESTART = "restart"
RESUME_ELSEWHERE = "resume-elsewhere"
STOP_CHAIN = "stop-chain"
ACTIONS = (RESTART, RESUME_ELSEWHERE, STOP_CHAIN)

# NVRx's "do not restart" is ft_launcher's word, never a worker's: a table may not claim it.
NVRX_NO_RESTART = 93

MEGATRON_RESUME_TO_DISAMBIGUATE = 16
MEGATRON_FAILED_ON_RESULT_VALIDATION = 17
MEGATRON = {
    MEGATRON_RESUME_TO_DISAMBIGUATE: RESUME_ELSEWHERE,
    MEGATRON_FAILED_ON_RESULT_VALIDATION: STOP_CHAIN,
}
# In words, for the ledger, status and the watcher.
MEGATRON_MEANINGS = {
    MEGATRON_RESUME_TO_DISAMBIGUATE: (
        "Megatron's rerun state machine saved a checkpoint and asks to rerun the last "
        "iteration on other GPUs, to tell a faulty GPU from the data"
    ),
    MEGATRON_FAILED_ON_RESULT_VALIDATION: (
        "Megatron's result validation failed (a NaN, Inf or spiky loss that reproduced)"
    ),
}
# Workloads whose exits mean what Megatron's do (the built-in trainer mimics it).
MEGATRON_LIKE = ("megatron", "cpu")


class TableError(ValueError):
    """The table cannot be read; the message says which entry and why."""


def parse(text: str) -> dict[int, str]:
    """`CODE=ACTION[,CODE=ACTION..]` -> {code: action}; "" is the empty table."""
    table: dict[int, str] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        code_text, sep, action = (part.strip() for part in entry.partition("="))
        if not sep or not code_text.isdecimal():
            raise TableError(f"{entry!r} is not CODE=ACTION (e.g. 17=stop-chain)")
        code = int(code_text)
        if not 1 <= code <= 255:
            raise TableError(f"exit code {code} is not 1-255")
        if code == NVRX_NO_RESTART:
            raise TableError(
                f"exit code {code} is NVRx's 'do not restart', ft_launcher's own; a worker "
                "exit cannot claim it"
            )
        if action not in ACTIONS:
            raise TableError(f"{entry!r}: the action must be one of {', '.join(ACTIONS)}")
        if code in table:
            raise TableError(f"exit code {code} is listed twice")
        table[code] = action
    return table


def render(table: dict[int, str]) -> str:
    return ",".join(f"{code}={action}" for code, action in sorted(table.items()))


def default_table(workload: str) -> dict[int, str]:
    return dict(MEGATRON) if workload in MEGATRON_LIKE else {}


def resolve(given: str | None, workload: str) -> dict[int, str]:
    """The chain's table: what --workload-exits says, else the workload's default."""
    return default_table(workload) if given is None else parse(given)


def meaning(code: int, action: str, workload: str) -> str:
    """One line a person reads: what this exit of the workload means."""
    if workload in MEGATRON_LIKE and code in MEGATRON_MEANINGS:
        return MEGATRON_MEANINGS[code]
    if action == RESTART:
        return f"the workload exited {code}"
    return f"the workload exited {code}, which the chain's --workload-exits maps to {action}"


def retention_warning(save_retention: int, checkpoint_fallbacks: int) -> str | None:
    """A chain that keeps fewer checkpoints than its fall-backs need stops where it
    promised to fall back (checkpoints/fallback.py): each fall-back needs one more kept
    checkpoint before the tracked one. Said at submit, with the numbers, not found out
    at 3 a.m. Every workload keeps --save-retention (task 0's keeper for Megatron and a
    script, the built-in trainer itself), and every one can fall back."""
    needed = checkpoint_fallbacks + 1
    if save_retention == 0 or save_retention >= needed:
        return None
    before = save_retention - 1
    return (
        f"--save-retention {save_retention} keeps the tracked checkpoint and {before} before "
        f"it, but --checkpoint-fallbacks {checkpoint_fallbacks} needs {checkpoint_fallbacks} "
        f"before it: fall-back {before + 1} would find none on disk and stop the chain; keep "
        f"{needed} or more (0 keeps all), or set --checkpoint-fallbacks {before}"
    )
