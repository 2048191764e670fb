"""Shared steps of the chain end-to-end tests (no tests here).

Every chain is submitted through the real CLI (`nvrx-appliance submit`), runs the real
sbatch, entrypoint, ft_launcher 0.7.0 and the cpu trainer on the local cluster, and is
judged from Slurm (squeue/sacct) and from disk (ledger, progress log, tracker).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from nvrx_appliance.devcluster import sick_node
from nvrx_appliance.devcluster.poll import Timeout, wait_until
from nvrx_appliance.observe.run_files import cycle_info
from nvrx_appliance.observe.slurm_output import expand_nodelist
from nvrx_appliance.observe.workdir import json_lines as read_jsonl
from nvrx_appliance.workflows.demo import QUICK, cli_flags

from .conftest import Cluster

CLI = str(Path(sys.executable).parent / "nvrx-appliance")

# Small and quick (the demo's settings): 2 worker processes per node, checkpoints every 5
# iterations, timeouts short enough that a lost node costs seconds, not minutes.
FAST = tuple(cli_flags(QUICK))
# How often a wait looks again: each look is a squeue or a read of a small log, and every
# wait returns this much sooner on average (the cluster tests wait a few hundred times).
POLL_S = 0.5


def processes(is_program, *in_environ: bytes) -> list[int]:
    """The pids, from /proc, whose command line `is_program` accepts (a list of bytes,
    argv[0] first) and whose environment holds every one of `in_environ` whole."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if is_program(argv) and all(wanted in environ for wanted in in_environ):
            pids.append(int(entry.name))
    return sorted(pids)


def worker_pids(work: Path, node: str) -> list[int]:
    """This chain's training ranks on `node` (devcluster/sick_node.py finds them)."""
    return sick_node.workers(work, node)


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:6]}"


def cli(
    cluster: Cluster, *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CLI, *args], env=cluster.env(**(env or {})), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def submit(
    cluster: Cluster, work: Path, name: str, *flags: str, env: dict[str, str] | None = None
) -> list[str]:
    """Submit a chain with the demo's quick timeouts; `env` reaches every process of the
    job (sbatch exports the submitter's environment)."""
    done = cli(
        cluster, "submit", *FAST, "--work-dir", str(work), "--job-name", name, *flags, "--json",
        env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["job_ids"]


_BUILT: dict[str, Path] = {}


def slow_storage(cluster: Cluster, **seconds: int) -> dict[str, str]:
    """The environment that makes the job's checkpoint storage slow (slow_storage.c,
    built once per session): slow_storage(cluster, NVRX_SLOW_SAVE_S=3)."""
    if "so" not in _BUILT:
        built = cluster.workdir("slow-storage") / "slow_storage.so"
        source = Path(__file__).with_name("slow_storage.c")
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(built), str(source)],
                       check=True)  # fmt: skip
        _BUILT["so"] = built
    return {"LD_PRELOAD": str(_BUILT["so"]), **{k: str(v) for k, v in seconds.items()}}


def squeue_ids(cluster: Cluster, name: str) -> list[str]:
    out = cluster.slurm("squeue", "-h", "-r", "--name", name, "-o", "%i").stdout
    return out.split()


def wait_idle(cluster: Cluster, name: str, timeout: float) -> None:
    """Until nothing of this chain is queued or running."""
    wait_until(lambda: not squeue_ids(cluster, name), timeout, f"chain {name} to drain", POLL_S)


def tasks(cluster: Cluster, array_job_id: str) -> dict[int, dict[str, str]]:
    """sacct's record of each task of one generation (pending ranges expanded). A task's
    own record wins over a pending range: accounting may still list the range that held
    it (e.g. `7_[0-3%3]`) after the task has started."""
    out: dict[int, dict[str, str]] = {}
    records = cluster.sacct(array_job_id)
    for record in sorted(records, key=lambda r: "[" not in r["JobID"]):
        _, _, task = record["JobID"].partition("_")
        body = task.strip("[]").split("%")[0]
        if not body:
            # Just after submit (or a controller restart) accounting may hold the
            # array's record before it knows its tasks: nothing to say about any yet.
            continue
        for part in body.split(","):
            low, _, high = part.partition("-")
            for t in range(int(low), int(high or low) + 1):
                out[t] = record
    return out


def ran(record: dict[str, str]) -> bool:
    """Did this task ever start on a node?"""
    return record["NodeList"] not in ("", "None assigned") and record["Start"] not in (
        "",
        "Unknown",
        "None",
    )


def state(record: dict[str, str]) -> str:
    return record["State"].split()[0]


def ledger(work: Path) -> list[dict[str, Any]]:
    return read_jsonl(work / "chain.jsonl")


def progress(work: Path) -> list[dict[str, Any]]:
    return read_jsonl(work / "logs" / "progress.jsonl")


def wait_in(work: Path, condition, timeout: float, what: str, shown=lambda: ""):
    """wait_until a condition on this chain's work dir; on timeout the report carries
    its logs (and what `shown` adds): the work dir goes with the cluster."""
    try:
        return wait_until(condition, timeout, what, POLL_S)
    except Timeout as exc:
        raise Timeout(f"{exc}\n{shown()}{logs_on_failure(work)}") from None


def wait_ledger(work: Path, count: int, timeout: float) -> list[dict[str, Any]]:
    def enough():
        rows = ledger(work)
        return rows if len(rows) >= count else None

    return wait_in(work, enough, timeout, f"{count} ledger entr(ies) in {work}",
                   lambda: f"ledger: {ledger(work)}\n")  # fmt: skip


def wait_event(work: Path, predicate, timeout: float, what: str) -> dict[str, Any]:
    def found():
        return next((e for e in progress(work) if predicate(e)), None)

    return wait_in(work, found, timeout, what)


def wait_tracker(work: Path, timeout: float) -> int:
    """Until the chain's first checkpoint is tracked; its iteration."""
    return wait_in(work, lambda: tracker(work), timeout, "the first checkpoint")


def tracker(work: Path) -> int | None:
    path = work / "checkpoints" / "latest_checkpointed_iteration.txt"
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text.isdigit() else None


def logs_on_failure(work: Path) -> str:
    """The generation logs, for an assertion message a person can act on."""
    parts = []
    for path in sorted((work / "logs").glob("slurm-*.out")):
        parts.append(f"==== {path.name}\n{path.read_text()[-3000:]}")
    for path in sorted((work / "logs").glob("*_cycle*.log")):
        parts.append(f"==== {path.name}\n{path.read_text()[-3000:]}")
    for path in sorted((work / "nvrx").glob("*/logs/ft_launcher.log")):
        parts.append(f"==== {path.relative_to(work)}\n{path.read_text()[-3000:]}")
    return "\n".join(parts)


def started_in_cycle(work: Path, array_job_id: str, cycle: int, timeout: float) -> dict[str, Any]:
    """The trainer's start event of one generation's NVRx cycle."""
    return wait_event(
        work,
        lambda e: e["event"] == "start" and e.get("slurm_array_job_id") == array_job_id
        and e.get("cycle") == cycle,
        timeout,
        f"training of generation {array_job_id} to start in cycle {cycle}",
    )  # fmt: skip


def cycle_nodes(work: Path, array_job_id: str, cycle: int) -> tuple[set[str], set[str]]:
    """(active, standby) nodes of one cycle, from its cycle-info file."""
    path = work / "nvrx" / array_job_id / "cycle_infos" / f"cycle_info.{array_job_id}.0.{cycle}"
    info = cycle_info(path.read_text())
    assert info is not None, logs_on_failure(work)
    return set(expand_nodelist(info.active_nodes)), set(expand_nodelist(info.standby_nodes))
