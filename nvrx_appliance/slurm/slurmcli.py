"""The Slurm CLI adapter: thin subprocess wrappers, nothing else.

Every call has a timeout and turns any failure (missing binary, unreachable
controller, non-zero exit, timeout) into SlurmUnavailable with one readable line, so a
caller can degrade ("Slurm unreachable") instead of crashing. Parsing of what these
commands print lives in slurm/parse.py, which imports no I/O; the watcher may reuse
`run` and keep its own parsing.

slurmctld is a shared resource: callers ask for many jobs in one call (one squeue, one
sacct) rather than one call per job.
"""

from __future__ import annotations

import getpass
import os
import subprocess
from collections.abc import Mapping, Sequence

from nvrx_appliance.slurm import parse

# Long enough for a busy controller, short enough that a dead one is reported while the
# person who typed the command is still looking at the terminal.
DEFAULT_TIMEOUT_S = 30.0


class SlurmUnavailable(Exception):
    """A Slurm command could not be run or failed; the message is one line."""


def run(
    argv: Sequence[str],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run one Slurm command and return its stdout."""
    conf = (env if env is not None else os.environ).get("SLURM_CONF")
    if conf and not os.path.exists(conf):
        # Said at once: the Slurm commands spend a minute retrying a missing file.
        raise SlurmUnavailable(f"SLURM_CONF={conf} does not exist")
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(env) if env is not None else None,
            check=False,
        )
    except FileNotFoundError:
        raise SlurmUnavailable(f"{argv[0]} not found on PATH (is Slurm installed here?)") from None
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"{argv[0]} did not answer within {timeout:.0f}s") from None
    if done.returncode != 0:
        detail = _last_line(done.stderr) or _last_line(done.stdout) or f"exit {done.returncode}"
        raise SlurmUnavailable(f"{' '.join(argv[:2])} failed: {detail}{_config_hint(conf)}")
    return done.stdout


# Where Debian's Slurm looks without SLURM_CONF (before asking DNS, "configless").
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"


def _config_hint(conf: str | None) -> str:
    """The usual real cause on a login node: this shell does not know the cluster."""
    if conf or os.path.exists(DEFAULT_SLURM_CONF):
        return ""
    return (
        f" (SLURM_CONF is not set and {DEFAULT_SLURM_CONF} does not exist: "
        "set SLURM_CONF to your cluster's slurm.conf)"
    )


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def current_user() -> str:
    return os.environ.get("USER") or getpass.getuser()


def show_config() -> dict[str, str]:
    return parse.scontrol_config(run(["scontrol", "show", "config"]))


def show_job(job_id: str) -> dict[str, str]:
    """`scontrol show job` of one job (an array job id shows its first record)."""
    records = parse.scontrol_records(run(["scontrol", "show", "job", "--oneliner", job_id]))
    if not records:
        raise SlurmUnavailable(f"scontrol knows no job {job_id}")
    return records[0]


def sbatch(args: Sequence[str], script: str, *, env: Mapping[str, str] | None = None) -> str:
    """Submit one job; returns its job id. `env` lets SBATCH_* reach sbatch untouched."""
    out = run(["sbatch", "--parsable", *args, script], env=env)
    return parse.sbatch_job_id(out)


def squeue(*, user: str, name: str | None = None) -> list[parse.QueueRow]:
    """This user's jobs (array tasks expanded), optionally only one job name."""
    argv = ["squeue", "--noheader", "--array", "--user", user, "--format", parse.SQUEUE_FORMAT]
    if name:
        argv += ["--name", name]
    return parse.squeue_rows(run(argv))


def sacct(*, user: str, name: str, since: str) -> list[parse.AcctRow]:
    """Accounting rows (one per array task) of this user's jobs of one name since a time."""
    argv = [
        "sacct",
        "--noheader",
        "--parsable2",
        "--allocations",
        "--user",
        user,
        "--name",
        name,
        "--starttime",
        since,
        "--format",
        parse.SACCT_FORMAT,
    ]
    return parse.sacct_rows(run(argv))


def scancel(args: Sequence[str]) -> None:
    run(["scancel", *args])
