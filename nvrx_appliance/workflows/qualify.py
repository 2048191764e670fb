"""`nvrx-appliance qualify --image X [submit options]`: recovery checks, run for real.

Submits the hand-off demo with the image through submit's own code, watches the
evidence until the checks in qualification.py are decided (or the deadline passes),
cancels what is left of the chain, and writes the qualification record next to the
image and into the work directory. Later submits judge the record next to the image
(qualification_status.py) and record the outcome in run.json; status shows it, and the work
directory's record too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import socket
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from nvrx_appliance import __version__, exitcodes, jsondoc
from nvrx_appliance.clifail import fail
from nvrx_appliance.files import write_atomic
from nvrx_appliance.image import qualification as q
from nvrx_appliance.image import qualification_status
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import slurmcli, workdir
from nvrx_appliance.observe.follow import follow
from nvrx_appliance.observe.slurmcli import Slurm
from nvrx_appliance.observe.workdir import NotFound
from nvrx_appliance.settings import resolve
from nvrx_appliance.settings.options import chain_options
from nvrx_appliance.slurm import cancel, commands
from nvrx_appliance.slurm import submit as submitting
from nvrx_appliance.workflows import submission

POLL_S = 2.0  # the evidence is files on a shared file system and one squeue per poll
DEFAULT_DEADLINE_S = 1800  # two generations with a fault each, on a slow cluster's queue
QUALIFY = "nvrx-appliance qualify"  # who speaks in its one-line failures

Echo = Callable[[str], None]


def _megatron_resumed(layout: Layout, array_job_id: str) -> int | None:
    texts = []
    for path in sorted(layout.logs.glob(f"*{array_job_id}*")):
        try:
            texts.append(path.read_text(errors="replace"))
        except OSError:
            continue
    return q.megatron_resumed_iteration("\n".join(texts))


def _live(slurm: Slurm, job_name: str, work_dir: str, user: str) -> bool:
    try:
        rows = slurm.squeue(user=user, name=job_name)
    except slurmcli.SlurmUnavailable:
        return True  # blind, not ended: the deadline decides
    return any(r.work_dir.rstrip("/") == work_dir.rstrip("/") for r in rows)


def gather(
    layout: Layout,
    *,
    first: str,
    second: str,
    job_name: str,
    workload: str,
    user: str,
    slurm: Slurm,
) -> q.Evidence:
    return q.Evidence(
        first=first,
        second=second,
        ledger=workdir.ledger(layout),
        events=workdir.json_lines(layout.progress_log) if workload == "cpu" else [],
        megatron_resumed=_megatron_resumed(layout, second) if workload == "megatron" else None,
        tracker=workdir.checkpoint_iteration(layout),
        chain_live=_live(slurm, job_name, str(layout.work_dir), user),
    )


def cluster_facts(evidence: q.Evidence, spec: Any) -> dict[str, Any]:
    try:
        config = slurmcli.show_config()
    except slurmcli.SlurmUnavailable:
        config = {}
    nodes = sorted(
        {str(e["task0_node"]) for e in evidence.ledger if e.get("task0_node")}
        | {str(e["host"]) for e in evidence.events if e.get("event") == "start" and e.get("host")}
    )
    return {
        "slurm_version": config.get("SLURM_VERSION", "unknown"),
        "cluster_name": config.get("ClusterName", "unknown"),
        "partition": spec.partition or "(default)",
        "runtime": spec.runtime,
        "workload": spec.workload,
        "nodes_seen": nodes,
        "submit_host": socket.gethostname(),
    }


def _now() -> str:
    return submitting.now_iso()


def _watch(
    layout: Layout, first: str, second: str, spec: Any, user: str, deadline: float, say: Echo
) -> tuple[list[q.Check], q.Evidence]:
    started = time.monotonic()
    shown: dict[str, bool | None] = {}
    last_progress = [""]

    def tick(slurm: Slurm) -> tuple[list[q.Check], q.Evidence]:
        evidence = gather(
            layout,
            first=first,
            second=second,
            job_name=spec.job_name,
            workload=spec.workload,
            user=user,
            slurm=slurm,
        )
        checks = q.judge(evidence)
        now = q.progress(evidence)
        if now != last_progress[0]:  # a line per change: readable in a CI log, not a spinner
            say(f"  [{time.monotonic() - started:5.0f} s] {now}")
            last_progress[0] = now
        for check in checks:
            if check.passed is not None and shown.get(check.name) is None:
                say(f"  {'ok  ' if check.passed else 'FAIL'}  {check.name}: {check.detail}")
            shown[check.name] = check.passed
        return checks, evidence

    followed = follow(
        tick, lambda seen: q.verdict(seen[0]) != "pending", deadline_s=deadline, poll_s=POLL_S
    )
    checks, evidence = followed.last
    return (q.timed_out(checks, deadline) if followed.timed_out else checks), evidence


def _write_records(data: dict[str, Any], image: str, layout: Layout) -> list[Path]:
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    written = []
    for path in (layout.qualification, q.record_path(image)):
        try:
            write_atomic(path, text)
            written.append(path)
        except OSError as exc:
            click.echo(f"warning: could not write {path} ({exc.strerror})", err=True)
    return written


@click.command("qualify", context_settings={"show_default": False})
@chain_options
@click.option(
    "--deadline",
    type=float,
    default=DEFAULT_DEADLINE_S,
    help=f"Seconds to wait for the checks to be decided.  [default: {DEFAULT_DEADLINE_S}]",
)
@click.option("--json", "as_json", is_flag=True, help="Print the qualification record as JSON.")
def qualify_command(
    deadline: float,
    as_json: bool,
    config_file: str | None,
    extra: tuple[str, ...],
    **params: Any,
) -> None:
    """Run the hand-off demo with --image here and record whether recovery worked.

    Takes submit's options, --config file and extra sbatch arguments after `--`; the
    mode is always the hand-off demo, with at least two generations (two unless
    --depth, NVRX_CHAIN_DEPTH or the config file says more). Writes
    <image>.qualification.json and <work>/qualification.json.
    """
    if params.get("mode") not in (None, "handoff"):
        fail(
            f"--mode {params['mode']}: qualify always runs the hand-off demo; drop --mode",
            prefix=QUALIFY,
        )
    params["mode"] = "handoff"  # as a flag, so it beats NVRX_MODE and the config file
    resolved = commands.resolve_chain(params, config_file, extra)
    resolved = _qualify_shape(resolved)
    if not resolved.spec.image:
        fail("--image: name the image to qualify (.sqsh or .sif)", prefix=QUALIFY)
    # Progress goes to stderr under --json, so that stdout is the one document.
    say = functools.partial(click.echo, err=as_json)
    user = slurmcli.current_user()
    started = _now()
    try:
        done = submission.submit_resolved(resolved, user=user, extra=extra, vet=_image_file_only)
    except submitting.Refused as exc:
        for problem in exc.problems:
            click.echo(f"{QUALIFY}: {problem}", err=True)
        sys.exit(exitcodes.USAGE)
    except submitting.SubmitFailed as exc:
        fail(str(exc), prefix=QUALIFY, code=1)
    # The record holds the image's own manifest, not what submit thought of it.
    image_manifest = qualification_status.image_manifest(done.plan.manifest.image or {})
    spec, layout = done.plan.manifest.spec, done.plan.manifest.layout
    first, second = done.job_ids[0], done.job_ids[1]
    say(
        f"Qualifying {spec.image} on this cluster: hand-off demo {spec.job_name!r}, "
        f"generations {first} -> {second}, work dir {spec.work_dir}"
    )
    try:
        checks, evidence = _watch(layout, first, second, spec, user, deadline, say)
    finally:
        # Already over, or Slurm unreachable: then the chain's own teardown ends it.
        with contextlib.suppress(NotFound, slurmcli.SlurmUnavailable):
            cancel.cancel_chain(layout.work_dir, user=user)
    data = q.record(
        image=str(Path(spec.image).resolve()),
        image_manifest=image_manifest,
        checks=checks,
        cluster=cluster_facts(evidence, spec),
        chain={"job_name": spec.job_name, "generations": done.job_ids, "work_dir": spec.work_dir},
        started=started,
        finished=_now(),
        tool_version=__version__,
    )
    written = _write_records(data, spec.image, layout)
    for path in written:
        say(f"Qualification record: {path}")
    if as_json:
        click.echo(jsondoc.dumps("qualification", {**data, "written": [str(p) for p in written]}))
    if data["result"] != "passed":
        click.echo(f"{spec.image}: qualification FAILED on this cluster", err=True)
        sys.exit(1)
    say(f"{spec.image}: qualified on this cluster (hand-off recovered)")


def _image_file_only(plan: submitting.Plan) -> None:
    if not plan.manifest.image:
        fail(
            "--image: qualify needs an image file whose manifest it can record, not a registry reference"
        )


def _qualify_shape(resolved: resolve.Resolved) -> resolve.Resolved:
    """Two generations and a name of its own unless the user chose them; never fewer
    than the two the checks need (the one that loses task 0 and its successor)."""
    spec, origins = resolved.spec, dict(resolved.origins)
    changes: dict[str, Any] = {}
    if origins["depth"] == "default":
        changes["depth"], origins["depth"] = 2, "default (qualify: 2)"
    elif spec.depth < 2:
        fail(
            f"--depth {spec.depth} (from {origins['depth']}): qualify needs at least 2 "
            "generations (the one that loses task 0 and its successor)",
            prefix=QUALIFY,
        )
    if origins["job_name"] == "default":
        changes["job_name"] = f"nvrx-qualify-{uuid.uuid4().hex[:6]}"
        origins["job_name"] = "default (qualify: a name of its own)"
    return resolve.Resolved(dataclasses.replace(spec, **changes), origins)
