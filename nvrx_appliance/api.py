"""The typed Python API: what the CLI does, for scripts that launch chains.

    from nvrx_appliance import api

    spec = api.chain_spec(work_dir="/lustre/alice/run", image="/lustre/img.sqsh",
                          train_tasks=32, hot_spares=1, cold_spares=32, depth=8)
    chain = api.submit(spec, sbatch_args=["--account=ml"])
    view = api.status(chain)          # a ChainView: generations, tasks, cycles, checkpoint
    text = api.logs(chain).text       # task 0's batch log of the newest generation
    api.cancel(chain)

Settings resolve exactly as the CLI's (keywords, the flags' names with underscores, beat
NVRX_* variables, which beat a config file, which beats the defaults) and are checked by
the same rules; a refusal raises SettingsError with every problem, each naming the flag
and the fix, before anything is written or queued. Slurm failures raise SlurmUnreachable.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvrx_appliance.manifest import Layout
from nvrx_appliance.settings import extra as extra_args
from nvrx_appliance.settings import resolve
from nvrx_appliance.settings.chain import ChainSpec, check, spec_fields
from nvrx_appliance.slurm import cancel as cancelling
from nvrx_appliance.slurm import logs as chainlogs
from nvrx_appliance.slurm import slurmcli, sources
from nvrx_appliance.slurm import submit as submitting
from nvrx_appliance.slurm.cancel import Cancelled
from nvrx_appliance.slurm.status import ChainView

__all__ = [
    "Cancelled",
    "Chain",
    "ChainSpec",
    "ChainView",
    "LogFile",
    "SettingsError",
    "SlurmUnreachable",
    "SubmitFailed",
    "cancel",
    "chain_spec",
    "locate",
    "logs",
    "status",
    "submit",
]

SlurmUnreachable = slurmcli.SlurmUnavailable


class SettingsError(ValueError):
    """Settings the CLI would refuse; `problems` holds one line per problem."""

    def __init__(self, problems: Sequence[str]):
        super().__init__("; ".join(problems))
        self.problems = list(problems)


class SubmitFailed(RuntimeError):
    """An sbatch failed; the generations already queued were cancelled again."""


@dataclass(frozen=True)
class Chain:
    """A queued chain: its name, work dir and the job ids of its generations, oldest first."""

    job_name: str
    work_dir: Path
    job_ids: tuple[str, ...]


@dataclass(frozen=True)
class LogFile:
    generation: str  # the array job id of the generation the log belongs to
    path: Path
    text: str


Target = Chain | str  # a Chain, or any job id of the chain, or its job name


def chain_spec(
    config: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    **settings: Any,
) -> ChainSpec:
    """A checked ChainSpec, resolved as `submit` resolves its flags.

    `settings` are keyed by field name (`train_tasks=32`); list settings (`megatron_args`,
    `script_args`) take the arguments as a list, or a string naming an arguments file, as
    their flags do. `environ` defaults to
    os.environ; pass {} to ignore NVRX_* variables.
    """
    names = {f.name for f in spec_fields()}
    unknown = sorted(set(settings) - names)
    if unknown:
        raise SettingsError([f"{name}: no such setting; see docs/knobs.md" for name in unknown])
    try:
        resolved = resolve.resolve(
            settings,
            os.environ if environ is None else environ,
            resolve.read_config(str(config)) if config else {},
            config_source=str(config or ""),
            cwd=str(cwd or os.getcwd()),
            python=sys.executable,
        )
    except resolve.SettingError as exc:
        raise SettingsError([str(exc)]) from None
    problems = check(resolved.spec)
    if problems:
        raise SettingsError([str(p) for p in problems])
    return resolved.spec


def submit(spec: ChainSpec, *, sbatch_args: Sequence[str] = (), force: bool = False) -> Chain:
    """Write run.json and the sbatch into the work dir and queue the chain.

    Checks against the cluster first (MaxArraySize, the work dir, a job name in use
    unless `force`), as `submit` does; `sbatch_args` are what follows `--` there.
    """
    extra = tuple(sbatch_args)
    found = extra_args.problem(extra)
    if found:
        raise SettingsError([f"sbatch_args: {found}"])
    defaults = ChainSpec()
    origins = {
        f.name: "default" if getattr(spec, f.name) == getattr(defaults, f.name) else "api"
        for f in spec_fields()
    }
    resolved = resolve.Resolved(spec, origins)
    user = slurmcli.current_user()
    try:
        plan = submitting.plan(resolved, dry_run=False, force=force, user=user, extra=extra)
        done = submitting.submit(plan)
    except submitting.Refused as exc:
        raise SettingsError([str(p) for p in exc.problems]) from None
    except submitting.SubmitFailed as exc:
        raise SubmitFailed(str(exc)) from None
    return Chain(spec.job_name, Path(spec.work_dir), tuple(done.job_ids))


def locate(target: Target, *, work_dir: str | Path | None = None) -> tuple[Path, str | None]:
    """(work dir, the generation a job id names) of the chain `target` belongs to.
    `work_dir` finds the chain without Slurm, once Slurm has forgotten the job."""
    if isinstance(target, Chain):
        return target.work_dir, None
    if work_dir:
        return Path(work_dir).resolve(), (target if target.isdigit() else None)
    return sources.locate_job(target, user=slurmcli.current_user())


def status(target: Target, *, work_dir: str | Path | None = None) -> ChainView:
    """The chain at a glance, as `status --json` shows it; `blind` names what could not
    be read (a ChainView with `slurm_reachable` False when Slurm did not answer)."""
    folder, _ = locate(target, work_dir=work_dir)
    return sources.read_chain(folder, user=slurmcli.current_user())


def cancel(target: Target, *, work_dir: str | Path | None = None) -> Cancelled:
    """Cancel every generation of the chain, queued or running; only the caller's jobs."""
    folder, _ = locate(target, work_dir=work_dir)
    return cancelling.cancel_chain(folder, user=slurmcli.current_user())


def logs(
    target: Target,
    *,
    task: int = 0,
    cycle: int | None = None,
    launcher: bool = False,
    work_dir: str | Path | None = None,
) -> LogFile:
    """One log of a generation: task 0's batch log unless `task`, `cycle` or `launcher`.

    A job id names its generation; a Chain or a name, the newest generation that wrote
    that log. Raises LookupError when there is no such log (yet).
    """
    folder, generation = locate(target, work_dir=work_dir)
    manifest = sources.load_manifest(folder)
    which = chainlogs.Which(task=task, cycle=cycle, launcher=launcher)
    generation, path = chainlogs.pick(
        Layout(folder), manifest["spec"]["job_name"], which, generation
    )
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        raise LookupError(f"the {which.describe()} of generation {generation} ({path}) "
                          "does not exist yet") from None  # fmt: skip
    return LogFile(generation, path, text)
