"""`nvrx-appliance submit`: validate, write run.json and the sbatch, queue the chain.

The imperative shell around resolve (settings), validate (refusals) and render (the
script). Either every generation is queued, or none is: a failing sbatch midway cancels
what was already queued and says so.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.files import write_atomic
from nvrx_appliance.image import qualification, qualification_status
from nvrx_appliance.manifest import Manifest
from nvrx_appliance.observe import slurmcli
from nvrx_appliance.settings import program_argv
from nvrx_appliance.settings.chain import DEMO_MODES, ChainSpec, Problem, flag
from nvrx_appliance.settings.resolve import Resolved
from nvrx_appliance.settings.validate import Facts, judge
from nvrx_appliance.slurm import probe, render


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
    job_ids: list[str]
    plan: Plan

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
    return (files("nvrx_appliance.slurm") / "generation.sbatch.tmpl").read_text()


def teardown_source() -> str:
    return (files("nvrx_appliance.slurm") / "teardown.py").read_text()


def write_teardown(layout: run_manifest.Layout) -> None:
    """Task 0's teardown beside run.json, owner-only: the batch script refuses to run it
    otherwise."""
    write_atomic(layout.teardown, teardown_source(), mode=0o600)


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    warnings += _ignored_demo_settings(resolved)
    found = _qualification_status(spec, facts)
    image = (
        None
        if found is None
        else {**facts.image_manifest, qualification_status.KEY: found.to_json()}
    )
    manifest = program_argv.complete(
        run_manifest.build(spec, created=now_iso(), user=user, image=image)
    )
    script = render.render(manifest, template=template_text(), extra=extra)
    return Plan(
        manifest=manifest,
        script=script,
        script_path=manifest.layout.sbatch(spec.job_name),
        sbatch_args=render.sbatch_args(manifest, extra),
        warnings=tuple(warnings),
        image_qualification=found,
    )


# Settings that only the demo modes read: in train mode nothing is ever injected.
DEMO_SETTINGS = ("fault_inject", "fault_ranks", "fault_delay", "fault_types", "gpu_failure")


def _ignored_demo_settings(resolved: Resolved) -> list[str]:
    """A fault setting the user gave for a chain that trains: say it does nothing."""
    if resolved.spec.mode in DEMO_MODES:
        return []
    return [
        f"{flag(name)} ({resolved.origins[name]}) applies to the demo modes only; "
        "this chain trains (--mode train), which never injects a fault, so it is ignored"
        for name in DEMO_SETTINGS
        if resolved.origins[name] != "default"
    ]


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
    layout.work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Slurm opens the --output file on the node at start: its directory must exist.
    layout.logs.mkdir(parents=True, exist_ok=True)
    run_manifest.save(plan.manifest)
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


def queue(plan: Plan, environ: Mapping[str, str] | None = None) -> list[str]:
    """sbatch x depth. On a failure, cancel what was queued and raise SubmitFailed."""
    env = dict(os.environ if environ is None else environ)  # SBATCH_* reach sbatch as set
    job_ids: list[str] = []
    for _ in range(plan.manifest.spec.depth):
        try:
            job_ids.append(slurmcli.sbatch(plan.sbatch_args, str(plan.script_path), env=env))
        except (slurmcli.SlurmUnavailable, ValueError) as exc:
            raise SubmitFailed(_roll_back(plan, job_ids, exc)) from None
    return job_ids


def _roll_back(plan: Plan, job_ids: list[str], cause: Exception) -> str:
    plan.manifest.layout.chain_marker.unlink(missing_ok=True)
    if not job_ids:
        return f"sbatch failed, nothing was queued: {cause}"
    try:
        slurmcli.scancel(job_ids)
    except slurmcli.SlurmUnavailable as exc:
        return (
            f"sbatch failed after queueing {', '.join(job_ids)} ({cause}), and cancelling them "
            f"failed too ({exc}): run `scancel {' '.join(job_ids)}` yourself"
        )
    return (
        f"sbatch failed after queueing {len(job_ids)} of {plan.manifest.spec.depth} "
        f"generations ({cause}); cancelled {', '.join(job_ids)}, so nothing is queued"
    )


def submit(plan: Plan, environ: Mapping[str, str] | None = None) -> Submitted:
    write(plan)
    done = Submitted(job_ids=queue(plan, environ), plan=plan)
    record = {**done.to_json(), "submitted": now_iso()}
    write_atomic(plan.manifest.layout.submitted, json.dumps(record) + "\n", 0o600)
    return done
