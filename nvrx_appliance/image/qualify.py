"""`nvrx-appliance qualify --image X [submit options]`: recovery checks, run for real.

Submits the hand-off demo with the image through submit's own code, watches the
evidence until the checks in qualification.py are decided (or the deadline passes),
cancels what is left of the chain, and writes the qualification record next to the
image and into the work directory. Later submits judge the record next to the image
(standing.py) and record the outcome in run.json; status shows it, and the work
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
from typing import Any, NoReturn

import click

from nvrx_appliance import __version__, exitcodes, jsondoc
from nvrx_appliance.files import write_atomic
from nvrx_appliance.image import qualification as q
from nvrx_appliance.image import standing
from nvrx_appliance.manifest import Layout
from nvrx_appliance.settings import resolve
from nvrx_appliance.settings.options import chain_options
from nvrx_appliance.slurm import cancel, commands, slurmcli
from nvrx_appliance.slurm import submit as submitting
from nvrx_appliance.slurm.sources import NotFound
from nvrx_appliance.slurm.teardown import parse_iteration, parse_ledger

POLL_S = 2.0  # the evidence is files on a shared file system and one squeue per poll
DEFAULT_DEADLINE_S = 1800  # two generations with a fault each, on a slow cluster's queue

Echo = Callable[[str], None]


def _fail(message: str) -> NoReturn:
    click.echo(f"nvrx-appliance qualify: {message}", err=True)
    sys.exit(exitcodes.USAGE)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    try:
        text = path.read_text()
    except OSError:
        return rows
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line being appended right now
    return rows


def _megatron_resumed(layout: Layout, array_job_id: str) -> int | None:
    texts = []
    for path in sorted(layout.logs.glob(f"*{array_job_id}*")):
        try:
            texts.append(path.read_text(errors="replace"))
        except OSError:
            continue
    return q.megatron_resumed_iteration("\n".join(texts))


def _live(job_name: str, work_dir: str, user: str) -> bool:
    try:
        rows = slurmcli.squeue(user=user, name=job_name)
    except slurmcli.SlurmUnavailable:
        return True  # blind, not ended: the deadline decides
    return any(r.work_dir.rstrip("/") == work_dir.rstrip("/") for r in rows)


def gather(
    layout: Layout, *, first: str, second: str, job_name: str, workload: str, user: str
) -> q.Evidence:
    ledger_text = layout.ledger.read_text() if layout.ledger.exists() else ""
    tracker_text = layout.tracker.read_text() if layout.tracker.exists() else ""
    return q.Evidence(
        first=first,
        second=second,
        ledger=parse_ledger(ledger_text),
        events=_read_jsonl(layout.progress_log) if workload == "cpu" else [],
        megatron_resumed=_megatron_resumed(layout, second) if workload == "megatron" else None,
        tracker=parse_iteration(tracker_text),
        chain_live=_live(job_name, str(layout.work_dir), user),
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
    last_progress = ""
    while True:
        evidence = gather(
            layout,
            first=first,
            second=second,
            job_name=spec.job_name,
            workload=spec.workload,
            user=user,
        )
        checks = q.judge(evidence)
        now = q.progress(evidence)
        if now != last_progress:  # a line per change: readable in a CI log, not a spinner
            say(f"  [{time.monotonic() - started:5.0f} s] {now}")
            last_progress = now
        for check in checks:
            if check.passed is not None and shown.get(check.name) is None:
                say(f"  {'ok  ' if check.passed else 'FAIL'}  {check.name}: {check.detail}")
            shown[check.name] = check.passed
        if q.verdict(checks) != "pending":
            return checks, evidence
        if time.monotonic() - started > deadline:
            return q.timed_out(checks, deadline), evidence
        time.sleep(POLL_S)


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
        _fail(f"--mode {params['mode']}: qualify always runs the hand-off demo; drop --mode")
    params["mode"] = "handoff"  # as a flag, so it beats NVRX_MODE and the config file
    resolved = commands.resolve_chain(params, config_file, extra)
    resolved = _qualify_shape(resolved)
    if not resolved.spec.image:
        _fail("--image: name the image to qualify (.sqsh or .sif)")
    # Progress goes to stderr under --json, so that stdout is the one document.
    say = functools.partial(click.echo, err=as_json)
    user = slurmcli.current_user()
    try:
        plan = submitting.plan(resolved, dry_run=False, force=False, user=user, extra=extra)
    except submitting.Refused as exc:
        for problem in exc.problems:
            click.echo(f"nvrx-appliance qualify: {problem}", err=True)
        sys.exit(exitcodes.USAGE)
    if not plan.manifest.image:
        _fail(
            "--image: qualify needs an image file whose manifest it can record, not a registry reference"
        )
    # The record holds the image's own manifest, not what submit thought of it.
    image_manifest = standing.image_manifest(plan.manifest.image)
    spec, layout = plan.manifest.spec, plan.manifest.layout
    started = _now()
    try:
        done = submitting.submit(plan)
    except submitting.SubmitFailed as exc:
        click.echo(f"nvrx-appliance qualify: {exc}", err=True)
        sys.exit(1)
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
        manifest=image_manifest,
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


def _qualify_shape(resolved: resolve.Resolved) -> resolve.Resolved:
    """Two generations and a name of its own unless the user chose them; never fewer
    than the two the checks need (the one that loses task 0 and its successor)."""
    spec, origins = resolved.spec, dict(resolved.origins)
    changes: dict[str, Any] = {}
    if origins["depth"] == "default":
        changes["depth"], origins["depth"] = 2, "default (qualify: 2)"
    elif spec.depth < 2:
        _fail(
            f"--depth {spec.depth} (from {origins['depth']}): qualify needs at least 2 "
            "generations (the one that loses task 0 and its successor)"
        )
    if origins["job_name"] == "default":
        changes["job_name"] = f"nvrx-qualify-{uuid.uuid4().hex[:6]}"
        origins["job_name"] = "default (qualify: a name of its own)"
    return resolve.Resolved(dataclasses.replace(spec, **changes), origins)
