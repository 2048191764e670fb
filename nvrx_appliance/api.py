"""The typed Python API, and the one way in: the CLI, the workflows (qualify, the demo)
and scripts that launch chains all resolve, check, submit and read chains through it.

    from nvrx_appliance import api

    spec = api.chain_spec(work_dir="/lustre/alice/run", image="/lustre/img.sqsh",
                          train_tasks=32, hot_spares=1, cold_spares=32, depth=8)
    chain = api.submit(spec, sbatch_args=["--account=ml"])   # a Submitted
    view = api.status(chain)          # a ChainView: its headline, generations, cycles, ...
    api.chains()                      # every chain of yours: a Listing, one ChainRow each
    account = api.report(chain)       # an Account: where the allocation's node-seconds went
    text = api.logs(chain).text       # task 0's batch log of the newest generation
    api.cancel(chain)

To review before queueing, `plan = api.prepare(spec)` checks against the cluster and
renders the sbatch without writing anything (plan.script, plan.command_lines,
plan.warnings); `api.submit(plan)` then queues exactly that. The CLI is this module plus
flag parsing and printing.

Settings resolve exactly as the CLI's (keywords, the flags' names with underscores, beat
NVRX_* variables, which beat a config file, which beats the defaults) and are checked by
the same rules; a refusal raises SettingsError with every problem, each naming the flag
and the fix, before anything is written or queued. Slurm failures raise SlurmUnreachable.
Nothing here prints or exits.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from nvrx_appliance.chain import cancel as cancelling
from nvrx_appliance.chain import chains as chain_list
from nvrx_appliance.chain import logs as chainlogs
from nvrx_appliance.chain import sources, submit_lock
from nvrx_appliance.chain import submit as submitting
from nvrx_appliance.chain.cancel import Cancelled
from nvrx_appliance.chain.chains import ChainRow, Listing
from nvrx_appliance.chain.sources import Located
from nvrx_appliance.chain.status import ChainView
from nvrx_appliance.goodput import gather
from nvrx_appliance.goodput.account import Account, account
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import deaths as death_record
from nvrx_appliance.observe import hangs as hang_record
from nvrx_appliance.observe import slurmcli, workdir
from nvrx_appliance.observe.slurm_output import ALLOCATIONS
from nvrx_appliance.observe.slurmcli import Slurm
from nvrx_appliance.plan import history as plan_history
from nvrx_appliance.plan import model as plan_model
from nvrx_appliance.plan import request as plan_request
from nvrx_appliance.settings import extra as extra_args
from nvrx_appliance.settings import resolve
from nvrx_appliance.settings.chain import ChainSpec, check, spec_fields

__all__ = [
    "Account",
    "Cancelled",
    "Chain",
    "ChainNotFound",
    "ChainRow",
    "ChainSpec",
    "ChainView",
    "Listing",
    "Located",
    "LogFile",
    "LogMissing",
    "Plan",
    "PlanRequest",
    "Resolution",
    "RunManifestUnreadable",
    "SettingsError",
    "SlurmUnreachable",
    "SubmitFailed",
    "SubmitInterrupted",
    "SubmitPlan",
    "Submitted",
    "cancel",
    "chain_spec",
    "chains",
    "find_chain",
    "follow_logs",
    "locate",
    "logs",
    "plan",
    "prepare",
    "report",
    "resolve_settings",
    "status",
    "submit",
]

SlurmUnreachable = slurmcli.SlurmUnavailable
ChainNotFound = workdir.NotFound  # no chain of this user behind a job id, name or work dir
# The chain's run.json was edited beyond reading (a ChainNotFound): its files cannot be
# read through it, yet cancel still ends it from what Slurm knows.
RunManifestUnreadable = workdir.Unreadable
# A checked, rendered submission (run manifest, sbatch script, sbatch lines, warnings);
# nothing of it is written until it is submitted.
SubmitPlan = submitting.Plan
# A queued chain: the plan it was queued from (plan.manifest: the run manifest) and the
# job ids of its generations, oldest first; job_name and work_dir name the chain.
Submitted = submitting.Submitted


class SettingsError(ValueError):
    """Settings the CLI would refuse; `problems` holds one line per problem."""

    def __init__(self, problems: Sequence[str]):
        super().__init__("; ".join(problems))
        self.problems = list(problems)


class SubmitFailed(RuntimeError):
    """An sbatch failed or timed out, or another submit of the same name or work dir held
    its lock too long; the generations already queued were cancelled again."""


class SubmitInterrupted(SubmitFailed):
    """Ctrl-C, SIGTERM or SIGHUP arrived while queueing; what was queued was cancelled.
    `signum` is the signal."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


@dataclass(frozen=True)
class Chain:
    """A chain by name and work dir, with the job ids of its generations, oldest first."""

    job_name: str
    work_dir: Path
    job_ids: tuple[str, ...]


@dataclass(frozen=True)
class LogFile:
    generation: str  # the array job id of the generation the log belongs to
    path: Path
    others: tuple[str, ...] = ()  # the `logs` options that show this generation's other logs

    @property
    def text(self) -> str:
        """The log as it is now (read on each access; undecodable bytes replaced)."""
        return self.path.read_text(errors="replace")


class LogMissing(LookupError):
    """The asked-for log does not exist yet (its generation may still be queued)."""

    def __init__(self, message: str, generation: str, path: Path):
        super().__init__(message)
        self.generation, self.path = generation, path


# A chain as submit returned it or find_chain found it, or any job id of the chain, or
# its job name.
Target = Chain | Submitted | Located | str


@dataclass(frozen=True)
class Resolution:
    """Every setting's value and where it came from, and what to tell the user about
    the names read (the reference scripts' variables)."""

    spec: ChainSpec
    origins: dict[str, str]  # field name -> "flag --x", "env NVRX_X", "config F", "default"
    notices: tuple[str, ...] = ()


def resolve_settings(
    flags: Mapping[str, Any],
    config: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    sbatch_args: Sequence[str] = (),
) -> Resolution:
    """Resolve every setting as `submit` does: `flags` (None: not given) beat NVRX_*
    variables, which beat the `config` file, which beats the defaults. Unchecked: see
    `chain_spec` and `prepare`. Raises SettingsError."""
    found = extra_args.problem(tuple(sbatch_args))
    if found:
        raise SettingsError([f"after `--`: {found}"])
    env = os.environ if environ is None else environ
    try:
        resolved = resolve.resolve(
            flags,
            env,
            resolve.read_config(str(config)) if config else {},
            config_source=str(config or ""),
            cwd=str(cwd or os.getcwd()),
            python=sys.executable,
        )
    except resolve.SettingError as exc:
        raise SettingsError([str(exc)]) from None
    notices = tuple(resolve.seed_notices(resolved, env))
    return Resolution(resolved.spec, resolved.origins, notices)


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
    their flags do. `environ` defaults to os.environ; pass {} to ignore NVRX_* variables.
    """
    names = {f.name for f in spec_fields()}
    unknown = sorted(set(settings) - names)
    if unknown:
        raise SettingsError([f"{name}: no such setting; see docs/knobs.md" for name in unknown])
    spec = resolve_settings(settings, config, environ=environ, cwd=cwd).spec
    problems = check(spec)
    if problems:
        raise SettingsError([str(p) for p in problems])
    return spec


def prepare(
    spec: ChainSpec,
    *,
    sbatch_args: Sequence[str] = (),
    force: bool = False,
    dry_run: bool = False,
    origins: Mapping[str, str] | None = None,
) -> SubmitPlan:
    """Check `spec` against the cluster (MaxArraySize, the work dir, a job name in use
    unless `force`) and render the sbatch; writes and queues nothing. `sbatch_args` are
    what follows `--` on the command line. With `dry_run`, an unreachable Slurm skips
    the cluster's checks with a warning instead of refusing. `origins` says where each
    setting came from (flag, env, config), for the warnings; by default a setting that
    differs from its default counts as given.
    """
    extra = tuple(sbatch_args)
    found = extra_args.problem(extra)
    if found:
        raise SettingsError([f"sbatch_args: {found}"])
    if origins is None:
        defaults = ChainSpec()
        origins = {
            f.name: "default" if getattr(spec, f.name) == getattr(defaults, f.name) else "api"
            for f in spec_fields()
        }
    resolved = resolve.Resolved(spec, dict(origins))
    user = slurmcli.current_user()
    try:
        return submitting.plan(resolved, dry_run=dry_run, force=force, user=user, extra=extra)
    except submitting.Refused as exc:
        raise SettingsError([str(p) for p in exc.problems]) from None


def submit(
    spec: ChainSpec | SubmitPlan,
    *,
    sbatch_args: Sequence[str] = (),
    force: bool = False,
    on_wait: Callable[[str], None] = lambda line: None,
) -> Submitted:
    """Write run.json and the sbatch into the work dir and queue the chain: a ChainSpec
    is prepared first (see `prepare`); a SubmitPlan is queued as it was reviewed, after
    its Slurm checks run again (a job may hold its name by now: SettingsError).

    Every generation is queued, or none: a failing, timed-out or interrupted sbatch
    cancels what was queued (SubmitFailed, SubmitInterrupted). One submit of a chain
    name or a work dir runs at a time for a user; `on_wait` hears, once, that this one
    waits for another."""
    if isinstance(spec, SubmitPlan):
        plan = spec
    else:
        plan = prepare(spec, sbatch_args=sbatch_args, force=force)
    try:
        return submitting.submit(plan, on_wait=on_wait)
    except submitting.Refused as exc:
        raise SettingsError([str(p) for p in exc.problems]) from None
    except submitting.SubmitInterrupted as exc:
        raise SubmitInterrupted(str(exc), exc.signum) from None
    except submitting.SubmitFailed as exc:
        raise SubmitFailed(str(exc)) from None
    except (submit_lock.LockBusy, submit_lock.LockUnavailable) as exc:
        raise SubmitFailed(f"nothing was written or queued: {exc}") from None


def find_chain(
    target: Target | None, *, work_dir: str | Path | None = None, user: str | None = None
) -> Located:
    """The chain `target` names, the one way every command finds it: a job id (of any
    generation, or a task's own), a job name (the newest chain of that name), or its
    `work_dir`, which needs no Slurm once Slurm has forgotten the chain. `user`: whose
    chain (default: the caller's). Raises ChainNotFound (with the near names), or
    SlurmUnreachable."""
    if isinstance(target, Located):
        return target
    owner = user or slurmcli.current_user()
    if isinstance(target, (Chain, Submitted)):
        return Located(Path(target.work_dir), target.job_name, None, tuple(target.job_ids), owner)
    return sources.resolve(target, user=owner, work_dir=work_dir)


def locate(target: Target | None, *, work_dir: str | Path | None = None) -> tuple[Path, str | None]:
    """(work dir, the generation a job id names) of the chain `target` belongs to
    (find_chain, in short)."""
    found = find_chain(target, work_dir=work_dir)
    return found.work_dir, found.generation


def chains(*, all_users: bool = False, slurm: Slurm | None = None) -> Listing:
    """Every chain of the caller (of every user, with all_users) that Slurm knows of, one
    row each: state in words, current generation, checkpoint iteration, goodput so far,
    work dir. Two Slurm calls whatever the number; `blind` names a call that failed."""
    user = None if all_users else slurmcli.current_user()
    return chain_list.list_chains(user=user, slurm=slurm)


def status(
    target: Target | None, *, work_dir: str | Path | None = None, slurm: Slurm | None = None
) -> ChainView:
    """The chain at a glance, as `status --json` shows it; `blind` names what could not
    be read (a ChainView with `slurm_reachable` False when Slurm did not answer)."""
    folder, _ = locate(target, work_dir=work_dir)
    return sources.read_chain(folder, user=slurmcli.current_user(), slurm=slurm)


def report(
    target: Target | None, *, work_dir: str | Path | None = None, slurm: Slurm | None = None
) -> Account:
    """Goodput: where the chain's allocation went so far (docs/goodput.md), from Slurm's
    accounting and the work dir. When sacct does not answer, `allocation_node_s` is None
    and `blind` says why; nothing is made up."""
    folder, _ = locate(target, work_dir=work_dir)
    slurm = slurm or Slurm()
    user = slurmcli.current_user()
    inputs = gather.read(
        folder,
        lambda query: slurm.sacct(user=user, fields=ALLOCATIONS, **query),
        now=time.time(),
    )
    return account(inputs)


# What `plan` is asked (nvrx_appliance/plan/request.py): the run's shape, its failure
# rates, the checkpoint and today's settings.
PlanRequest = plan_request.Request
Plan = plan_model.Plan


def plan(
    request: PlanRequest,
    *,
    from_chain: Target | None = None,
    work_dir: str | Path | None = None,
    slurm: Slurm | None = None,
) -> Plan:
    """The ETTR a run of this shape can expect, the settings that maximise it and the
    seeds' design beside it (docs/plan.md). With `from_chain` (or `work_dir`) that chain's
    history gives the failure rates, the save cost and the in-job restart's cost; a
    `work_dir` is read from its own files alone, never through Slurm. Raises SettingsError
    (one line per bad value, naming its option) before anything runs, a chain included."""
    bad = plan_request.problems(request)
    if bad:
        raise SettingsError(bad)
    history = None
    if from_chain is not None or work_dir is not None:
        account = _planned_chain(from_chain, work_dir, slurm)
        history = plan_history.read(account, request.nodes_per_task)
        if not history.training_node_days:
            raise SettingsError(
                [f"--from-chain: chain {account.job_name} has trained no node time yet; "
                 "plan it with published rates (drop --from-chain) or once it has run"]
            )  # fmt: skip
        request = plan_request.with_history(request, history)
        bad = plan_request.problems(request)  # what the chain measured, checked as given
        if bad:
            raise SettingsError(bad)
    found = plan_model.plan(
        plan_request.scenario(request, history),
        request.today,
        seeds=request.seeds,
        grace=request.grace_s,
        storage_stall_s=request.storage_stall_s,
        most_time_s=request.most_time_s,
    )
    return replace(found, step_s=request.step_s)


def _not_asked(query: dict[str, Any]) -> list[Any]:
    raise slurmcli.SlurmUnavailable("not asked: --work-dir reads the chain's own files")


def _planned_chain(
    target: Target | None, work_dir: str | Path | None, slurm: Slurm | None
) -> Account:
    """The chain a plan reads: by name or job id, report's account from Slurm's; by its
    work dir, from the files there alone (the ledger, cycle-info files and training
    record), however slow or down Slurm is."""
    if work_dir is None:
        found = report(target, slurm=slurm)
        if found.allocation_node_s is None:
            raise SlurmUnreachable(
                f"chain {found.job_name}: {'; '.join(found.blind) or 'no accounting'}"
            )
        return found
    folder, _ = locate(target, work_dir=work_dir)
    inputs = gather.read(folder, _not_asked, now=time.time())
    return account(replace(inputs, allocations=gather.held_from_files(inputs), blind=()))


def cancel(target: Target | None, *, work_dir: str | Path | None = None) -> Cancelled:
    """Cancel every generation of the chain, queued or running; only the caller's jobs.
    A run.json edited beyond reading does not stop it: Slurm's name for the chain does."""
    found = find_chain(target, work_dir=work_dir)
    return cancelling.cancel_chain(
        found.work_dir, user=slurmcli.current_user(), job_name=found.job_name
    )


def _log_choice(
    target: Target | None, task: int, cycle: int | None, launcher: bool, work_dir: str | Path | None
) -> tuple[Layout, str, chainlogs.Which, str | None, dict[str, Any]]:
    if sum((task != 0, cycle is not None, launcher)) > 1:
        raise ValueError("task, cycle and launcher each pick one log; give one of them")
    folder, generation = locate(target, work_dir=work_dir)
    manifest = workdir.load_manifest(folder)
    which = chainlogs.Which(task=task, cycle=cycle, launcher=launcher)
    return Layout(folder), manifest["spec"]["job_name"], which, generation, manifest


def logs(
    target: Target | None,
    *,
    task: int = 0,
    cycle: int | None = None,
    launcher: bool = False,
    work_dir: str | Path | None = None,
) -> LogFile:
    """One log of a generation: task 0's batch log unless `task`, `cycle` or `launcher`.

    A job id names its generation; a Chain or a name, the newest generation that wrote
    that log. Raises LogMissing when that log does not exist yet, LookupError when the
    work dir records no generation at all, ChainNotFound when there is no such chain.
    """
    layout, job_name, which, generation, manifest = _log_choice(
        target, task, cycle, launcher, work_dir
    )
    generation, path = chainlogs.pick(layout, job_name, which, generation)
    if not path.exists():
        raise LogMissing(
            f"the {which.describe()} of generation {generation} ({path}) does not exist yet",
            generation,
            path,
        )
    size = manifest["shape"].get("array_size")
    more = chainlogs.others(layout, job_name, generation, size if isinstance(size, int) else 1)
    return LogFile(generation, path, tuple(more))


def hang_verdicts(target: Target | None, *, work_dir: str | Path | None = None) -> list[str]:
    """Each hang of the chain judged, in words (docs/hangs.md): "generation 41: node3 hung
    in cycle 2: ...; kept out of the next rendezvous ..."; [] when none was."""
    return _per_generation(target, work_dir, workdir.hangs, hang_record.sentence)


def node_deaths(target: Target | None, *, work_dir: str | Path | None = None) -> list[str]:
    """Each node of the chain that task 0's liveness judge found dead, in words
    (docs/liveness.md): "generation 41: node2 stopped answering at 18:33:41 UTC; no reset,
    no exit: a silent death ..."; [] when none was."""
    return _per_generation(target, work_dir, workdir.deaths, death_record.sentence)


def _per_generation(
    target: Target | None,
    work_dir: str | Path | None,
    read: Callable[[Layout, Any], Mapping[str, Sequence[Any]]],
    say: Callable[[Any, int], str],
) -> list[str]:
    """The chain's records of one kind (read from its generations), each said with the
    generation's array job id and how long the chain keeps a node out."""
    folder, _ = locate(target, work_dir=work_dir)
    layout = Layout(folder)
    exclude_for = int(workdir.load_manifest(folder)["spec"].get("exclude_for", 0))
    found = read(layout, chainlogs.generations(layout))
    return [
        f"generation {array_job_id}: {say(record, exclude_for)}"
        for array_job_id, records in found.items()
        for record in records
    ]


def hang_stacks(target: Target | None, *, work_dir: str | Path | None = None) -> list[str]:
    """Every hang record of the chain (or of the generation a job id names), its stacks
    grouped, as lines for a person (docs/hangs.md); [] when no hang was judged."""
    folder, generation = locate(target, work_dir=work_dir)
    layout = Layout(folder)
    ids = [generation] if generation is not None else chainlogs.generations(layout)
    lines: list[str] = []
    for array_job_id, found in workdir.hangs(layout, ids).items():
        for hang in found:
            path = layout.hangs(array_job_id) / f"cycle{hang.cycle}.json"
            lines += [f"==> generation {array_job_id}, {path} <==", *hang_record.grouped(hang)]
    return lines


def follow_logs(
    target: Target | None,
    out: TextIO,
    *,
    task: int = 0,
    cycle: int | None = None,
    launcher: bool = False,
    work_dir: str | Path | None = None,
    announce: Callable[[Path], None] = lambda path: None,
) -> None:
    """Write one log to `out` as it grows, moving on to the same log of each later
    generation as it appears (a job id pins its generation); runs until interrupted.
    `announce` is called with each file as it is opened."""
    layout, job_name, which, generation, _ = _log_choice(target, task, cycle, launcher, work_dir)
    chainlogs.pick(layout, job_name, which, generation)  # LookupError before following
    pinned = generation if isinstance(target, str) and target.isdigit() else None
    chainlogs.follow(lambda: chainlogs.pick(layout, job_name, which, pinned)[1], out, announce)
