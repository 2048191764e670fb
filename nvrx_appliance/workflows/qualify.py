"""Qualify an image on this cluster (`nvrx-appliance qualify`, cli/qualify.py): recovery
checks, run for real.

Submits the hand-off demo with the image through api.submit, watches the
evidence until the checks in qualification.py are decided (or the deadline passes),
cancels what is left of the chain, and writes the qualification record next to the
image and into the work directory. Later submits judge the record next to the image
(qualification_status.py) and record the outcome in run.json; status shows it, and the work
directory's record too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvrx_appliance import __version__, api
from nvrx_appliance.clock import now_iso
from nvrx_appliance.files import write_atomic
from nvrx_appliance.image import qualification as q
from nvrx_appliance.image import qualification_status
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import slurmcli, workdir
from nvrx_appliance.observe.follow import follow
from nvrx_appliance.observe.slurmcli import Slurm

POLL_S = 2.0  # the evidence is files on a shared file system and one squeue per poll
DEFAULT_DEADLINE_S = 1800  # two generations with a fault each, on a slow cluster's queue

Echo = Callable[[str], None]


def _megatron_resumed(layout: Layout, array_job_id: str) -> int | None:
    texts = []
    for path in sorted(layout.logs.glob(f"*{array_job_id}*")):
        try:
            texts.append(path.read_text(errors="replace"))
        except OSError:
            continue
    return q.megatron_resumed_iteration("\n".join(texts))


def _stack_samples(layout: Layout, generations: Sequence[str]) -> list[dict[str, Any]]:
    """Every rank's last stack sample of the qualification run, on every node it ran on."""
    found = []
    for array in generations:
        for path in sorted(layout.stacks(array).glob("cycle*/*.json")):
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(path.read_text())
                # A node's published file holds its ranks' samples (node/stack_publisher.py).
                if isinstance(data, dict) and isinstance(data.get("samples"), list):
                    found += [s for s in data["samples"] if isinstance(s, dict)]
                elif isinstance(data, dict):
                    found.append(data)
    return found


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


def _write_records(data: dict[str, Any], image: str, layout: Layout, warn: Echo) -> list[Path]:
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    written = []
    for path in (layout.qualification, q.record_path(image)):
        try:
            write_atomic(path, text)
            written.append(path)
        except OSError as exc:
            warn(f"could not write {path} ({exc.strerror})")
    return written


def settle(resolved: api.Resolution) -> api.Resolution:
    """What qualify runs: the hand-off demo with an image, two generations unless the
    user chose more (never fewer than the two the checks need: the one that loses task
    0 and its successor), a job name of its own unless the user chose one. Raises
    SettingsError."""
    spec, origins = resolved.spec, dict(resolved.origins)
    if not spec.image:
        raise api.SettingsError(["--image: name the image to qualify (.sqsh or .sif)"])
    changes: dict[str, Any] = {"mode": "handoff"}
    if origins["depth"] == "default":
        changes["depth"], origins["depth"] = 2, "default (qualify: 2)"
    elif spec.depth < 2:
        raise api.SettingsError(
            [
                f"--depth {spec.depth} (from {origins['depth']}): qualify needs at least 2 "
                "generations (the one that loses task 0 and its successor)"
            ]
        )
    if origins["job_name"] == "default":
        changes["job_name"] = f"nvrx-qualify-{uuid.uuid4().hex[:6]}"
        origins["job_name"] = "default (qualify: a name of its own)"
    return api.Resolution(dataclasses.replace(spec, **changes), origins, resolved.notices)


@dataclass(frozen=True)
class Outcome:
    record: dict[str, Any]  # the qualification record (image/qualification.py)
    written: list[Path]  # where it was written
    submitted: api.Submitted

    @property
    def passed(self) -> bool:
        return self.record["result"] == "passed"


def run(
    resolved: api.Resolution,
    *,
    sbatch_args: Sequence[str] = (),
    deadline: float = DEFAULT_DEADLINE_S,
    say: Echo = lambda line: None,
    warn: Echo = lambda line: None,
) -> Outcome:
    """Queue the hand-off demo of `settle(resolved)` with its image, follow it until the
    checks are decided or `deadline` seconds pass, cancel what is left of the chain, and
    write the record beside the image and into the work dir. Raises SettingsError (an
    image qualify cannot record), SubmitFailed or SubmitInterrupted; `say` hears the
    progress, `warn` what could not be done."""
    resolved = settle(resolved)
    plan = api.prepare(resolved.spec, sbatch_args=sbatch_args, origins=resolved.origins)
    if not plan.manifest.image:
        raise api.SettingsError(
            ["--image: qualify needs an image file whose manifest it can record, not a "
             "registry reference"]
        )  # fmt: skip
    started = now_iso()
    done = api.submit(plan, on_wait=warn)
    # The record holds the image's own manifest, not what submit thought of it.
    image_manifest = qualification_status.image_manifest(plan.manifest.image)
    spec, layout = plan.manifest.spec, plan.manifest.layout
    first, second = done.job_ids[0], done.job_ids[1]
    say(
        f"Qualifying {spec.image} on this cluster: hand-off demo {spec.job_name!r}, "
        f"generations {first} -> {second}, work dir {spec.work_dir}"
    )
    try:
        checks, evidence = _watch(layout, first, second, spec, plan.manifest.user, deadline, say)
    finally:
        # Already over, or Slurm unreachable: then the chain's own teardown ends it.
        with contextlib.suppress(api.ChainNotFound, api.SlurmUnreachable):
            api.cancel(done)
    stacks = q.stack_sampling(_stack_samples(layout, done.job_ids))
    for line in q.stack_lines(stacks):
        (warn if line.startswith("stacks cannot") else say)(line)
    data = q.record(
        image=str(Path(spec.image).resolve()),
        image_manifest=image_manifest,
        checks=checks,
        cluster={**cluster_facts(evidence, spec), "stacks": stacks},
        chain={"job_name": spec.job_name, "generations": done.job_ids, "work_dir": spec.work_dir},
        started=started,
        finished=now_iso(),
        tool_version=__version__,
    )
    return Outcome(data, _write_records(data, spec.image, layout, warn), done)
