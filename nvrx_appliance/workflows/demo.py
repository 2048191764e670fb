"""The hand-off demo on the local Slurm cluster (`nvrx-appliance demo`, `make demo`;
cli/demo.py is its command line).

Brings the cluster up, submits the reference deployment's hand-off demo with the cpu trainer on bare
metal (a workload fault -> in-job restart; the GPU-failure injector on task 0's node ->
the next generation takes over), follows it, and ends with a recovery report, its
goodput lines and picture.

In segment mode (`--segment`) the cluster has six nodes in NVLink domains of two (a
stand-in nvidia-smi reports each domain's ClusterUUID, devcluster/nvlink.py), each array
task is one domain, and NVRx selects whole domains (`--ft-segment 2`), as on GB200-class
systems.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nvrx_appliance import api
from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.files import write_atomic
from nvrx_appliance.goodput import picture
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import slurmcli, workdir
from nvrx_appliance.observe.follow import follow
from nvrx_appliance.observe.slurmcli import Slurm
from nvrx_appliance.settings.chain import flag
from nvrx_appliance.workflows import demo_report

Say = Callable[[str], None]


class DemoFailed(RuntimeError):
    """The demo could not run (the local cluster did not come up)."""


# Timeouts sized for a local cluster on a couple of cores, where a lost node should cost
# seconds: the production defaults (minutes) suit real clusters and container starts.
QUICK: dict[str, Any] = {
    "workload": "cpu",
    "runtime": "bare",
    "gpus_per_node": 2,  # two trainer processes per node
    "segment": "off",  # no GPUs, so no ClusterUUID: NVRx's simple hot-spare mode
    "save_interval": 5,
    "time_limit": "00:10:00",
    "setup_timeout": 120,
    "step_timeout": 30,
    "checkpointing_timeout": 60,
    "out_of_section_timeout": 60,
    "join_timeout": 90,
    "store_connect_wait": 30,
    "rdzv_host_wait": 60,
    "lease_stale_after": 15,
}
DEMO: dict[str, Any] = {
    **QUICK,
    "mode": "handoff",
    "train_tasks": 1,
    "hot_spares": 1,
    "cold_spares": 1,
    "depth": 2,
    "fault_delay": 5.0,
}
# Segment mode: each array task is one NVLink domain of two nodes, and NVRx trains on
# whole domains only; one trainer process per node keeps six nodes within two cores.
SEGMENT_DEMO: dict[str, Any] = {
    **DEMO,
    "nodes_per_task": 2,
    "gpus_per_node": 1,
    "segment": "2",
}
# The cluster that has those domains: three of two nodes (task 0, the hot spare, the
# cold spare).
SEGMENT_CLUSTER = ("--nodes", "6", "--nvlink-domain-size", "2")
DEADLINE_S = 480  # the whole run takes about two minutes; this is "something is wrong"
POLL_S = 1.0
HEARTBEAT_S = 15.0
ACCOUNTING_S = 30.0  # slurmdbd lags the controller by a second or two; this is "it is down"


def cli_flags(settings: dict[str, Any]) -> list[str]:
    """The same settings as `submit` flags (for tests and for the printed command)."""
    return [part for name, value in settings.items() for part in (flag(name), str(value))]


def _cli() -> str:
    return str(Path(sys.executable).parent / "nvrx-appliance")


def _cluster_up(say: Say, options: tuple[str, ...]) -> dict[str, Any]:
    say("[1/4] the local Slurm cluster (the first time installs its Debian packages)")
    if subprocess.run([_cli(), "cluster", "up", *options]).returncode != 0:
        raise DemoFailed("the local cluster did not come up; see the lines above")
    status = subprocess.run([_cli(), "cluster", "status", "--json"], capture_output=True, text=True)
    return json.loads(status.stdout)


def _submit(work: Path, name: str, demo: dict[str, Any], say: Say) -> list[str]:
    """Raises api.SettingsError, SubmitFailed or SubmitInterrupted."""
    settings = {**demo, "work_dir": str(work), "job_name": name}
    say("[2/4] nvrx-appliance submit " + " ".join(cli_flags(settings)))
    resolved = api.resolve_settings(settings)
    plan = api.prepare(resolved.spec, origins=resolved.origins)
    job_ids = api.submit(plan).job_ids
    say(f"      queued generations {', '.join(job_ids)}; work dir {work}")
    return job_ids


@dataclass
class _Shown:
    """What the follower has said so far, so each tick says only what is new."""

    events: int = 0
    ledger: int = 0
    running: set[str] = field(default_factory=set)
    beat: float = field(default_factory=time.monotonic)


def _follow(work: Path, name: str, user: str, say: Say) -> None:
    say("[3/4] following the chain (Ctrl-C stops following; the chain keeps running)")
    layout, shown = Layout(work), _Shown()

    def tick(slurm: Slurm) -> bool:
        """Reports what is new; True once the chain has left the queue after an ending."""
        events, ledger = workdir.json_lines(layout.progress_log), workdir.ledger(layout)
        for event in events[shown.events :]:
            line = demo_report.event_line(event)
            if line:
                say("      " + line)
        for entry in ledger[shown.ledger :]:
            say("      " + demo_report.ledger_line(entry))
        shown.events, shown.ledger = len(events), len(ledger)
        rows = slurm.squeue(user=user, name=name)
        for row in rows:
            if (
                row.task_id == 0
                and row.state == "RUNNING"
                and row.array_job_id not in shown.running
            ):
                shown.running.add(row.array_job_id)
                say(f"      generation {row.array_job_id} is running: task 0 on {row.nodes}")
        if time.monotonic() - shown.beat >= HEARTBEAT_S:
            shown.beat = time.monotonic()
            say("      " + _heartbeat(events))
        return not rows and bool(ledger)

    if follow(tick, bool, deadline_s=DEADLINE_S, poll_s=POLL_S).timed_out:
        say(f"      still running after {DEADLINE_S} s: cancelling the demo chain")
        subprocess.run([_cli(), "cancel", name], env=os.environ)


def _domains_line(status: dict[str, Any]) -> str:
    by_uuid: dict[str, list[str]] = {}
    for node in status.get("nodes", []):
        by_uuid.setdefault(node.get("cluster_uuid") or "none", []).append(node["name"])
    return "; ".join(f"{'+'.join(nodes)} ClusterUUID {uuid}" for uuid, nodes in by_uuid.items())


def _nvrx_log(view, array_job_id: str) -> demo_report.NvrxLog:
    manifest = run_manifest.load(Layout(Path(view.work_dir)).run_json)
    try:
        text = manifest.layout.launcher_log(array_job_id).read_text(errors="replace")
    except OSError:
        text = ""
    return demo_report.nvrx_log(text)


def _heartbeat(events: list[dict[str, Any]]) -> str:
    steps = [e["iteration"] for e in events if e.get("event") == "step"]
    saved = [e["iteration"] for e in events if e.get("event") == "checkpoint"]
    return (
        f"{demo_report.clock(time.time())}  ... iteration {steps[-1] if steps else '-'}, "
        f"last checkpoint {saved[-1] if saved else '-'}"
    )


@dataclass(frozen=True)
class Outcome:
    job_name: str
    work_dir: Path
    job_ids: list[str]
    report: demo_report.Report


def run(say: Say, *, segment: bool = False) -> Outcome:
    """Bring the local cluster up, queue the demo chain, follow it, report. Raises
    DemoFailed, or api's SettingsError, SubmitFailed or SubmitInterrupted.

    segment: the same demo in segment mode, on two-node NVLink domains."""
    status = _cluster_up(say, SEGMENT_CLUSTER if segment else ())
    os.environ.update(status["env"])  # this process and every Slurm command it runs
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name, work = f"nvrx-demo-{stamp}", Path(status["work_root"]) / f"demo-{stamp}"
    user = slurmcli.current_user()
    if segment:
        say("      NVLink domains (nvidia-smi stand-in): " + _domains_line(status))
    job_ids = _submit(work, name, SEGMENT_DEMO if segment else DEMO, say)
    _follow(work, name, user, say)
    say("[4/4] recovery report")
    view = api.status(name, work_dir=work)
    layout = Layout(work)
    logs = {g.array_job_id: _nvrx_log(view, g.array_job_id) for g in view.generations}
    # Accounting records a task's end a moment after squeue forgets it: wait for it.
    goodput = follow(
        lambda slurm: api.report(name, work_dir=work, slurm=slurm),
        lambda found: all(g.end is not None for g in found.generations),
        deadline_s=ACCOUNTING_S,
        poll_s=POLL_S,
    ).last
    result = demo_report.report(
        view, workdir.json_lines(layout.progress_log), workdir.ledger(layout), logs, goodput
    )
    for line in result.lines:
        say("      " + line if line else "")
    write_atomic(layout.goodput_picture, picture.svg(goodput), 0o644, durable=False)
    say(f"      picture: {layout.goodput_picture} (open it in a browser)")
    say(
        f"\nEverything is in {work}; `nvrx-appliance status {name}` shows the chain again, "
        f"`nvrx-appliance report {name}` its goodput."
    )
    return Outcome(job_name=name, work_dir=work, job_ids=job_ids, report=result)
