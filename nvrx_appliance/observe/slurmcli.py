"""The one Slurm adapter: the commands run, bounded, and their answers parsed. It only
reads (squeue, sacct, scontrol show); what changes the queue is chain/job_control.py's,
through `run` here.

Every call has a timeout and turns any failure (missing binary, unreachable
controller, non-zero exit, timeout) into SlurmUnavailable with one readable line, so a
caller can degrade ("Slurm unreachable") instead of crashing. Parsing of what these
commands print lives in observe/slurm_output.py, which imports no I/O.

slurmctld is a shared resource: callers ask for many jobs in one call (one squeue, one
sacct) rather than one call per job, and the loops that follow a chain share one
`Slurm` with a minimum interval, so a second question within it is answered from the
last answer instead of another RPC (submitit's InfoWatcher is the model).
"""

from __future__ import annotations

import getpass
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

from nvrx_appliance.observe import slurm_output
from nvrx_appliance.observe.slurm_output import CHAIN_ACCOUNTING, USER_JOBS, AcctRow
from nvrx_appliance.observe.types import Task

# Long enough for a busy controller, short enough that a dead one is reported while the
# person who typed the command is still looking at the terminal.
DEFAULT_TIMEOUT_S = 30.0


class SlurmUnavailable(Exception):
    """A Slurm command could not be run or failed; the message is one line."""


class SlurmTimeout(SlurmUnavailable):
    """A Slurm command did not answer in time: what it asked for may still have happened
    (an sbatch whose job id never came back may have queued the job)."""


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
        raise SlurmTimeout(f"{argv[0]} did not answer within {timeout:.0f}s") from None
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


Runner = Callable[[Sequence[str], float], str]


class Slurm:
    """Slurm's query commands, each bounded by `timeout`.

    `min_interval_s` > 0 makes this a shared, rate-limited view: the same question asked
    again within the interval (by any caller holding this object) gets the last answer.
    Failures are never kept: the next ask tries again.
    """

    def __init__(
        self,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
        run_command: Runner | None = None,
        min_interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout = timeout
        self._run = run_command or (lambda argv, limit: run(argv, timeout=limit, env=env))
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._answers: dict[tuple[str, ...], tuple[float, str]] = {}

    def call(self, argv: Sequence[str]) -> str:
        key = tuple(argv)
        now = self._clock()
        if key in self._answers and now - self._answers[key][0] < self.min_interval_s:
            return self._answers[key][1]
        out = self._run(argv, self.timeout)
        if self.min_interval_s > 0:
            self._answers[key] = (now, out)
        return out

    def squeue(
        self, *, user: str | None, name: str | None = None, fields: tuple[str, ...] = USER_JOBS
    ) -> list[Task]:
        """This user's jobs (array tasks expanded; None: every user's), optionally only one
        job name."""
        argv = ["squeue", "--noheader", "--array", *(["--user", user] if user else [])]
        argv += ["--format", slurm_output.squeue_format(fields)]
        if name:
            argv += ["--name", name]
        return slurm_output.squeue_tasks(self.call(argv), fields)

    def sacct(
        self,
        *,
        user: str | None = None,
        name: str | None = None,
        since: str | None = None,
        jobs: Sequence[str] = (),
        fields: tuple[str, ...] = CHAIN_ACCOUNTING,
        all_users: bool = False,
    ) -> list[AcctRow]:
        """Accounting rows, one per array task: of some job ids, or of a user's jobs (of
        every user's, with all_users) of one name since a time."""
        argv = ["sacct", "--noheader", "--parsable2", "--allocations"]
        argv += ["--format", slurm_output.sacct_format(fields)]
        if all_users:
            argv.append("--allusers")
        for option, value in (("--user", user), ("--name", name), ("--starttime", since)):
            if value:
                argv += [option, value]
        if jobs:
            argv += ["--jobs", ",".join(jobs)]
        return slurm_output.sacct_rows(self.call(argv), fields)

    def scontrol_jobs(self, job_id: str) -> list[dict[str, str]]:
        """`scontrol show job` records; none for an id Slurm does not (or no longer) know."""
        try:
            out = self.call(["scontrol", "--oneliner", "show", "job", job_id])
        except SlurmUnavailable as exc:
            if "invalid job id" in str(exc).lower():
                return []
            raise
        return slurm_output.scontrol_records(out)

    def show_config(self) -> dict[str, str]:
        return slurm_output.scontrol_config(self.call(["scontrol", "show", "config"]))


def show_config() -> dict[str, str]:
    return Slurm().show_config()


def squeue(*, user: str, name: str | None = None) -> list[Task]:
    return Slurm().squeue(user=user, name=name)
