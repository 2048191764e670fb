"""The reference deployment's environment names that are not a submit setting of ours.

NVRx's reference (examples/fault_tolerance/deployment/slurm: the sbatch and
submit_chain.sh) reads some variables this tool has no setting for. A user coming from
it may still export them, so each one is read: when it says what the appliance does
anyway it is taken with a notice, and otherwise it is refused in one line naming what
to use instead. None is ignored in silence. (The reference names that are settings are
chain.py's environment names and resolve.SEED_NAMES; docs/migrating.md has them all.)

Pure: the environment is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping

from nvrx_appliance.settings.chain import ChainSpec, flag

NO_RESTART_EXIT_CODE = "93"  # NVRx's own: ft_launcher's default, the teardown's trigger

# Read by the reference, with no setting here: refused, saying what to use instead.
REFUSED = {
    "LR_DECAY_SAMPLES": (
        "put --lr-decay-samples N in your --megatron-args file (your arguments follow "
        "the preset's, so yours wins)"
    ),
    "SAVE_RETAIN_INTERVAL": (
        "the appliance's retention is a count of complete checkpoints kept: set "
        "--save-retention N (NVRX_SAVE_RETENTION)"
    ),
}
# Taken only when they agree with what the appliance does (derived or fixed).
CHECKED = ("NVRX_ACTIVE_TASKS", "NVRX_NO_RESTART_EXIT_CODE")
NAMES = (*REFUSED, *CHECKED)


def _active_tasks(spec: ChainSpec) -> str:
    return str(spec.train_tasks + spec.hot_spares)


def problems(spec: ChainSpec, environ: Mapping[str, str]) -> list[str]:
    """One line for each reference name set in the environment that cannot be taken."""
    found = [
        f"{name} is the reference scripts' name, with no setting here: {fix}"
        for name, fix in REFUSED.items()
        if name in environ
    ]
    active = environ.get("NVRX_ACTIVE_TASKS")
    if active is not None and active.strip() != _active_tasks(spec):
        found.append(
            f"NVRX_ACTIVE_TASKS={active!r} disagrees with {flag('train_tasks')} + "
            f"{flag('hot_spares')} = {_active_tasks(spec)}, the array throttle the appliance "
            "derives; unset NVRX_ACTIVE_TASKS and set --hot-spares (NVRX_HOT_SPARES)"
        )
    code = environ.get("NVRX_NO_RESTART_EXIT_CODE")
    if code is not None and code.strip() != NO_RESTART_EXIT_CODE:
        found.append(
            f"NVRX_NO_RESTART_EXIT_CODE={code!r}: the appliance keeps NVRx's own code 93 "
            "for 'do not restart' from ft_launcher to the teardown, the spares and "
            "nvrx-watch (its own failures use 70-77, never 93), so that no hop of the "
            "chain can read another code; unset it"
        )
    return found


def notices(spec: ChainSpec, environ: Mapping[str, str]) -> list[str]:
    """One line for each reference name that was taken because it agrees."""
    found = []
    if environ.get("NVRX_ACTIVE_TASKS", "").strip() == _active_tasks(spec):
        found.append(
            f"NVRX_ACTIVE_TASKS={_active_tasks(spec)} agrees with --train-tasks + "
            "--hot-spares; the appliance derives it (the array throttle)"
        )
    if environ.get("NVRX_NO_RESTART_EXIT_CODE", "").strip() == NO_RESTART_EXIT_CODE:
        found.append("NVRX_NO_RESTART_EXIT_CODE=93 is the code the appliance acts on anyway")
    return found
