"""`nvrx-appliance submit`: validate, write run.json and the sbatch, queue the chain.

The imperative shell around resolve (settings), validate (refusals) and render (the
script). Either every generation is queued, or none is: a failing, timed-out or
interrupted sbatch midway cancels what was already queued and says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.chain import job_control, probe, render, submit_lock
from nvrx_appliance.clock import now_iso
from nvrx_appliance.files import make_private_dirs, write_atomic
from nvrx_appliance.image import qualification, qualification_status
from nvrx_appliance.layout import Layout
from nvrx_appliance.manifest import Manifest
from nvrx_appliance.observe import slurmcli
from nvrx_appliance.observe.types import LIVE_STATES
from nvrx_appliance.settings import exit_actions, generation_end, policy
from nvrx_appliance.settings.chain import ChainSpec, Problem
from nvrx_appliance.settings.megatron import rules as megatron_rules
from nvrx_appliance.settings.resolve import Resolved
from nvrx_appliance.settings.validate import Facts, cluster_problems, judge, unrecorded_warning


class Refused(Exception):
    """Submission refused before anything was written; carries every problem found."""

    def __init__(self, problems: list[Problem]):
        super().__init__("; ".join(map(str, problems)))
        self.problems = problems


class SubmitFailed(Exception):
    """sbatch failed after validation; whatever was queued has been cancelled."""


@dataclass(frozen=True)
class Plan:
    manifest: Manifest
    script: str
    script_path: Path
    sbatch_args: list[str]  # per generation, before the script path
    warnings: tuple[str, ...]
    # When the image file has an image manifest.
    image_qualification: qualification_status.QualificationStatus | None = None
    force: bool = False  # --force: a live job may hold the name or the work dir

    @property
    def image_note(self) -> str:
        """What to say about the image once per submit ("" when there is no image file)."""
        image = self.manifest.image
        if self.image_qualification is None or image is None:
            return ""
        return qualification_status.message(
            self.manifest.spec.image,
            qualification_status.image_manifest(image),
            self.image_qualification,
        )

    @property
    def command_lines(self) -> list[list[str]]:
        argv = ["sbatch", *self.sbatch_args, str(self.script_path)]
        return [argv] * self.manifest.spec.depth


@dataclass(frozen=True)
class Submitted:
    """A queued chain: the plan it was queued from and its generations, oldest first."""

    job_ids: list[str]
    plan: Plan

    @property
    def job_name(self) -> str:
        return self.plan.manifest.spec.job_name

    @property
    def work_dir(self) -> Path:
        return Path(self.plan.manifest.spec.work_dir)

    def to_json(self) -> dict:
        spec, layout = self.plan.manifest.spec, self.plan.manifest.layout
        return {
            "job_name": spec.job_name,
            "job_ids": self.job_ids,
            "array": self.plan.manifest.shape.array_spec,
            "work_dir": spec.work_dir,
            "run_json": str(layout.run_json),
            "sbatch": str(self.plan.script_path),
        }


def template_text() -> str:
    return (files("nvrx_appliance.chain") / "generation.sbatch.tmpl").read_text()


def write_teardown(layout: Layout) -> None:
    """What runs on the job's host (nvrx_appliance/jobhost/: task 0's teardown, the drain
    poller, the node memory, their helper module) beside run.json, owner-only: the batch
    script refuses to run them otherwise."""
    for path in layout.host_code:
        source = (files("nvrx_appliance.jobhost") / path.name).read_text()
        write_atomic(path, source, mode=0o600)


def plan(
    resolved: Resolved,
    *,
    dry_run: bool,
    force: bool,
    user: str,
    extra: tuple[str, ...] = (),
    gather: Callable[..., Facts] = probe.gather,
) -> Plan:
    """Validate and render. Raises Refused; writes nothing."""
    spec = resolved.spec
    facts = gather(spec, with_slurm=True, user=user)
    warnings: list[str] = []
    if dry_run and facts.slurm_error:
        # A plan can be reviewed anywhere: skip what needs the cluster, and say so.
        warnings.append(
            f"Slurm unreachable ({facts.slurm_error}); skipped MaxArraySize and job-name checks"
        )
        facts = Facts(**{**facts.__dict__, "slurm_error": None})
    problems = judge(spec, facts, force=force)
    if problems:
        raise Refused(problems)
    warnings += policy.unused(spec, resolved.origins)
    if spec.workload == "megatron":
        warnings += megatron_rules.notes(spec.megatron_args)
    warnings += generation_end.warnings(spec)
    kept = exit_actions.retention_warning(spec.save_retention, spec.checkpoint_fallbacks)
    unrecorded = unrecorded_warning(spec, facts)
    warnings += [w for w in (kept, unrecorded) if w]
    found = _qualification_status(spec, facts)
    image = None
    if found is not None and facts.image_manifest is not None:
        image = {**facts.image_manifest, qualification_status.KEY: found.to_json()}
    manifest = run_manifest.build(
        spec,
        created=now_iso(),
        user=user,
        image=image,
        previous_wandb_run_id=facts.work_dir_wandb_run_id,
        checkpoint_start=facts.work_dir_tracker,
    )
    script = render.render(manifest, template=template_text(), extra=extra)
    return Plan(
        manifest=manifest,
        script=script,
        script_path=manifest.layout.sbatch(spec.job_name),
        sbatch_args=render.sbatch_args(manifest, extra),
        warnings=tuple(warnings),
        image_qualification=found,
        force=force,
    )


def _qualification_status(
    spec: ChainSpec, facts: Facts
) -> qualification_status.QualificationStatus | None:
    """The image's qualification status; None without an image file (bare metal, a
    registry image)."""
    if facts.image_manifest is None:
        return None
    return qualification_status.assess(
        facts.image_manifest,
        facts.image_qualification,
        record_path=str(qualification.record_path(Path(spec.image).resolve())),
        cluster=facts.cluster_name,
    )


def write(plan: Plan) -> None:
    layout = plan.manifest.layout
    # Owner-only: run.json there names the code every node runs (probe.py refuses a
    # work dir others can write).
    make_private_dirs(layout.work_dir)
    # Slurm opens the --output file on the node at start: its directory must exist.
    make_private_dirs(layout.logs)
    run_manifest.save(plan.manifest)
    # A chain that completed here left its training-done marker; this one was let
    # through to train further (or forced), and must not be ended by the old marker.
    layout.training_done.unlink(missing_ok=True)
    write_teardown(layout)  # before the script that runs it
    write_atomic(plan.script_path, plan.script, mode=0o700)
    # Before the first sbatch, never after: a generation that ends at once (exit 93)
    # removes the marker, and writing it later would resurrect a finished chain.
    marker = {
        "job_name": plan.manifest.spec.job_name,
        "user": plan.manifest.user,
        "created": plan.manifest.created,
        "run_json": str(layout.run_json),
    }
    write_atomic(layout.chain_marker, json.dumps(marker) + "\n", 0o600)


class Interrupted(Exception):
    """SIGTERM or SIGHUP arrived while the chain was being queued."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SubmitInterrupted(SubmitFailed):
    """Ctrl-C, SIGTERM or SIGHUP while queueing; what was queued has been cancelled.
    `signum` is the signal, for the exit code a shell expects (128 + signum)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


# Ending the submit midway must roll back, not leave part of a chain queued.
_RAISED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _signals(handler: Any, which: tuple[signal.Signals, ...]) -> Iterator[None]:
    """Install `handler` for `which` meanwhile (the main thread only: elsewhere Python
    delivers no signal to the code, and signal.signal refuses)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {signum: signal.signal(signum, handler) for signum in which}
    try:
        yield
    finally:
        for signum, old in before.items():
            signal.signal(signum, old)


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def submit(
    plan: Plan,
    environ: Mapping[str, str] | None = None,
    *,
    lock_dir: Path | None = None,
    on_wait: Callable[[str], None] = lambda line: None,
) -> Submitted:
    """Write the work dir's files and queue every generation, or none.

    Under the submit lock of the chain's name and work dir, the Slurm checks run again
    (a plan may have been reviewed a while ago, and another submit may have queued the
    name since); then run.json, the sbatch and the chain marker are written and sbatch
    runs `depth` times. An sbatch that fails, times out, or is interrupted (Ctrl-C,
    SIGTERM, SIGHUP) rolls back: what was queued is cancelled, the chain marker removed.
    Raises Refused (nothing written), SubmitFailed or SubmitInterrupted.
    """
    spec = plan.manifest.spec
    with submit_lock.hold(spec.job_name, Path(spec.work_dir), directory=lock_dir, on_wait=on_wait):
        facts = probe.recheck(spec, plan.manifest.user)
        problems = cluster_problems(spec, facts, force=plan.force)
        if problems:
            raise Refused(problems)
        before = set(facts.name_in_use)  # live jobs of this name that are not ours (--force)
        env = dict(os.environ if environ is None else environ)  # SBATCH_* reach sbatch as set
        queued: list[str] = []
        try:
            with _signals(_raise_interrupted, _RAISED_SIGNALS):
                write(plan)
                for _ in range(spec.depth):
                    queued.append(
                        job_control.sbatch(plan.sbatch_args, str(plan.script_path), env=env)
                    )
                done = Submitted(job_ids=queued, plan=plan)
                record = {**done.to_json(), "submitted": now_iso()}
                write_atomic(plan.manifest.layout.submitted, json.dumps(record) + "\n", 0o600)
                return done
        except (KeyboardInterrupt, Interrupted) as exc:
            signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
            what = signal.Signals(signum).name
            raise SubmitInterrupted(_roll_back(plan, queued, what, before), signum) from None
        except (slurmcli.SlurmUnavailable, ValueError) as exc:
            raise SubmitFailed(_roll_back(plan, queued, exc, before)) from None


def _roll_back(plan: Plan, queued: list[str], cause: Exception | str, before: set[str]) -> str:
    """Undo a submit that stopped midway; returns what to tell the user. Signals wait
    until it is done (each Slurm call in it is bounded): a second Ctrl-C must not leave
    the chain half-queued either."""
    with _signals(signal.SIG_IGN, _HELD_SIGNALS):
        layout = plan.manifest.layout
        layout.chain_marker.unlink(missing_ok=True)
        layout.submitted.unlink(missing_ok=True)
        # An sbatch that timed out, was interrupted, or printed no job id may have
        # queued its job all the same: find it by name, owner and work dir.
        unsure = isinstance(cause, (str, slurmcli.SlurmTimeout, ValueError))
        strays, search_error = ([], "") if not unsure else _strays(plan, queued, before)
        doomed = queued + strays
        stopped = f"{cause}" if isinstance(cause, str) else f"sbatch failed ({cause})"
        cancel_error = ""
        if doomed:
            try:
                job_control.scancel(doomed)
            except slurmcli.SlurmUnavailable as exc:
                cancel_error = str(exc)
        return _rollback_message(plan, stopped, queued, strays, search_error, cancel_error)


def _strays(plan: Plan, queued: list[str], before: set[str]) -> tuple[list[str], str]:
    """Live jobs of this chain that no sbatch answer named: (ids, "") or ([], why not)."""
    spec = plan.manifest.spec
    try:
        rows = slurmcli.Slurm().squeue(user=plan.manifest.user, name=spec.job_name)
    except (slurmcli.SlurmUnavailable, ValueError) as exc:
        return [], str(exc)
    ours = {
        r.array_job_id
        for r in rows
        if r.work_dir.rstrip("/") == spec.work_dir.rstrip("/") and r.state in LIVE_STATES
    }
    return sorted(ours - before - set(queued), key=int), ""


def _rollback_message(
    plan: Plan,
    stopped: str,
    queued: list[str],
    strays: list[str],
    search_error: str,
    cancel_error: str,
) -> str:
    spec, user = plan.manifest.spec, plan.manifest.user
    doomed = queued + strays
    if cancel_error:
        return (
            f"{stopped} after queueing {', '.join(doomed)}, and cancelling them failed too "
            f"({cancel_error}): run `scancel {' '.join(doomed)}` yourself"
        )
    if doomed:
        found = f" (and {', '.join(strays)}, which the unanswered sbatch queued)" if strays else ""
        said = (
            f"{stopped} after queueing {len(queued)} of {spec.depth} generations; "
            f"cancelled {', '.join(queued) or 'none'}{found}"
        )
    else:
        said = f"{stopped}; nothing was queued"
    if search_error:
        return (
            f"{said}; but an unanswered sbatch may have queued a job, and Slurm could not be "
            f"asked ({search_error}): check `squeue --user {user} --name {spec.job_name}` and "
            "scancel what it lists"
        )
    return said + (", so nothing is queued" if doomed else "")
