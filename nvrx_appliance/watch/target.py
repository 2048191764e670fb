"""From `nvrx-watch <job id>` to the run being watched: chain name, owner, and paths.

Name and owner come from scontrol (sacct once the id has aged out of the controller,
the state file once it has aged out of accounting too). The batch script's path is
scontrol's Command=; once the id has aged out of scontrol, the Command= remembered in
the state file, else the script sacct's SubmitLine names, else the Command= of a
generation of the same chain that squeue still lists. The paths come from the run's
run.json when nvrx-appliance submitted it (the batch script lives in the work dir and
the job runs there), and otherwise from the batch script itself, read statically.
Flags override each piece. Nothing here writes anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

from nvrx_appliance.layout import Layout
from nvrx_appliance.manifest import ManifestError, load
from nvrx_appliance.watch import batch_script, readers
from nvrx_appliance.watch.findings import Run
from nvrx_appliance.watch.platform import JobInfo, Platform, SlurmUnavailable


class ResolveError(Exception):
    """The run cannot be identified; the message names the flag that fixes it."""


@dataclass(frozen=True)
class Request:
    """What the person asked for (flags, or NVRX_WATCH_* variables)."""

    job_id: str = ""
    job_name: str = ""
    work_dir: str = ""
    cycle_info_glob: str = ""
    tracker: str = ""  # --checkpoint-file
    max_restarts: int | None = None
    platform: str = "slurm"
    user: str = ""  # the chain's owner, over what the job id says (or the caller)


def cycle_glob(layout: Layout) -> str:
    return str(layout.cycle_infos("*") / "cycle_info.*")


def identify(request: Request, platform: Platform, caller: str, known: dict) -> JobInfo:
    """Name and owner. Raises SlurmUnavailable when Slurm cannot answer and the job id has
    no remembered identity (`known`: job id -> identity from the state file). --user
    names the owner over all of them (an SRE watching another's chain by name)."""
    info = _identify(request, platform, request.user or caller, known)
    return replace(info, owner=request.user) if request.user else info


def _identify(request: Request, platform: Platform, caller: str, known: dict) -> JobInfo:
    if request.platform == "none" or not request.job_id:
        if not request.job_name and not request.work_dir and not request.cycle_info_glob:
            raise ResolveError("give a job id, or --job-name, or --work-dir with --platform none")
        return JobInfo(job_name=request.job_name, owner=caller, work_dir=request.work_dir)
    remembered = _remembered(known.get(request.job_id))
    try:
        info = platform.describe(request.job_id)
    except SlurmUnavailable:
        if remembered is not None:
            return remembered
        raise
    if info is None and remembered is not None:
        return remembered
    if info is None:
        if request.job_name:
            return JobInfo(job_name=request.job_name, owner=caller, work_dir=request.work_dir)
        raise ResolveError(
            f"job {request.job_id} is unknown to scontrol and sacct; pass --job-name "
            "(and --work-dir) to watch its chain by name"
        )
    if (
        info.source == "sacct"
        and remembered is not None
        and _same_job(remembered, info)
        and remembered.command
    ):
        # Aged out of scontrol: its Command= from an earlier pass is exact, while sacct's
        # SubmitLine only says how the script was named when it was submitted.
        info = replace(info, command=remembered.command)
    if info.source == "sacct" and not info.command:
        info = _script_of_a_live_generation(platform, info)
    if request.job_name:
        info = replace(info, job_name=request.job_name)
    return info


def _script_of_a_live_generation(platform: Platform, info: JobInfo) -> JobInfo:
    """The batch script of a generation of the same chain that scontrol still knows.

    The id has aged out of scontrol and its SubmitLine cannot name the script (none
    recorded, `sbatch < script`, a relative name under --chdir); but a chain's
    generations run the same script, and a queued or running one has scontrol's
    Command= and WorkDir=. Running ones first: they are the most likely to be current.
    """
    try:
        generations = platform.generations(info.job_name, info.owner)
    except SlurmUnavailable:
        return info
    for generation in sorted(generations, key=lambda g: not g.running):
        try:
            live = platform.describe(generation.array_job_id)
        except SlurmUnavailable:
            continue
        if live is None or (live.job_name, live.owner) != (info.job_name, info.owner):
            continue
        if live.source == "scontrol" and live.command:
            return replace(info, command=live.command, work_dir=info.work_dir or live.work_dir)
    return info


def _remembered(entry: object) -> JobInfo | None:
    """A job id's identity as the state file remembers it; None for an entry of the wrong
    shape. A hand edit (a key added, a value that is no string) must cost the memory of
    one job id, never every pass: JobInfo(**entry) raised TypeError in each."""
    if not isinstance(entry, dict):
        return None
    values = {f.name: entry.get(f.name, "") for f in fields(JobInfo)}
    if not all(isinstance(v, str) for v in values.values()) or not values["job_name"]:
        return None
    return JobInfo(**values)


def _same_job(remembered: JobInfo, info: JobInfo) -> bool:
    return (remembered.job_name, remembered.owner) == (info.job_name, info.owner)


def locate(request: Request, info: JobInfo) -> tuple[Run, list[str]]:
    """Where the run's files are. Returns the run and notes for the log."""
    notes: list[str] = []
    run = Run(job_name=info.job_name, owner=info.owner)
    manifest = _find_manifest(request, info, notes)
    if manifest is not None:
        layout = manifest.layout
        run = replace(
            run,
            work_dir=str(layout.work_dir),
            cycle_glob=cycle_glob(layout),
            tracker=str(layout.tracker),
            max_restarts=manifest.spec.max_restarts,
            train_tasks=manifest.spec.train_tasks,
            spares=manifest.spec.hot_spares + manifest.spec.cold_spares,
            origin=f"run.json ({layout.run_json})",
            chain=manifest.chain_id,
            exclude_for=manifest.spec.exclude_for,
        )
        if not run.job_name:
            run = replace(run, job_name=manifest.spec.job_name)
    elif request.work_dir:
        layout = Layout(Path(request.work_dir))
        run = replace(
            run,
            work_dir=request.work_dir,
            cycle_glob=cycle_glob(layout),
            tracker=str(layout.tracker),
            origin="--work-dir",
        )
    elif info.command:
        run = _from_script(run, info, notes)
    if not run.job_name:  # --platform none without a name: call the run by its directory
        run = replace(run, job_name=Path(request.work_dir or ".").resolve().name or "run")
    flags = [flag for flag, given in (("--cycle-info-glob", request.cycle_info_glob),
                                      ("--checkpoint-file", request.tracker)) if given]  # fmt: skip
    run = replace(
        run,
        cycle_glob=request.cycle_info_glob or run.cycle_glob,
        tracker=request.tracker or run.tracker,
        max_restarts=request.max_restarts if request.max_restarts is not None else run.max_restarts,
        origin=" + ".join([*([run.origin] if run.origin else []), *flags]),
    )
    if not run.cycle_glob:
        notes.append(
            "cycle-info files: not located, restart-anomaly detectors are off; pass "
            "--work-dir or --cycle-info-glob"
        )
    return run, notes


def _find_manifest(request: Request, info: JobInfo, notes: list[str]):
    candidates = [request.work_dir, os.path.dirname(info.command), info.work_dir]
    for directory in dict.fromkeys(c for c in candidates if c):
        path = Layout(Path(directory)).run_json
        if not path.is_file():
            continue
        try:
            manifest = load(path)
        except ManifestError as exc:
            notes.append(f"ignoring {path}: {exc}")
            continue
        if info.job_name and manifest.spec.job_name != info.job_name:
            notes.append(f"ignoring {path}: it belongs to chain {manifest.spec.job_name}")
            continue
        return manifest
    return None


def _from_script(run: Run, info: JobInfo, notes: list[str]) -> Run:
    text = readers.read_script(info.command)
    if text is None:
        notes.append(f"batch script {info.command} is not readable; pass --work-dir")
        return run
    known = {
        "SLURM_JOB_NAME": info.job_name,
        "SLURM_JOB_USER": info.owner,
        "USER": info.owner,
        "SLURM_SUBMIT_DIR": info.work_dir,
    }
    found = batch_script.resolve(
        info.command,
        text,
        readers.read_script,
        known,
        info.work_dir or os.path.dirname(info.command),
        job={"Command": info.command, "WorkDir": info.work_dir},
    )
    for what in found.unresolved:
        notes.append(
            f"batch script: cannot resolve {what}; pass --cycle-info-glob / --checkpoint-file"
        )
    return replace(
        run,
        cycle_glob=os.path.join(found.cycle_info_dir, "cycle_info.*")
        if found.cycle_info_dir
        else "",
        tracker=found.tracker or "",
        origin="batch script " + " + ".join(found.files_read),
    )
