"""The local Slurm cluster for integration tests.

One cluster per machine, brought up once per pytest session under the machine-wide
cluster lock, which the session holds until it ends: two sessions (two helpers, or CI
and a person) queue instead of tearing the cluster down under each other. The session
takes the cluster down at the end unless NVRX_KEEP_CLUSTER=1.

Without root the cluster cannot exist: outside CI the tests skip and say why; under
CI=true nothing may skip for that reason, so the session fails loudly instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nvrx_appliance.devcluster.lock import cluster_lock
from nvrx_appliance.devcluster.poll import wait_until
from tests import process_tree

CLI = str(Path(sys.executable).parent / "nvrx-appliance")
IN_CI = os.environ.get("CI") == "true"
KEEP = os.environ.get("NVRX_KEEP_CLUSTER") == "1"
UP_TIMEOUT_S = 600  # a first `up` on a fresh machine installs Debian packages

# sacct's final states: the job will not change again.
FINAL_STATES = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
}
SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "NodeList", "Start", "End")


def cluster_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`nvrx-appliance cluster ARGS` (inside the session's lock, as its child). The
    daemons it starts serve every session on the machine and outlive this one on
    purpose: they do not carry its marker (tests/process_tree.py), their jobs' steps do."""
    return subprocess.run(
        [CLI, "cluster", *args], capture_output=True, text=True, timeout=timeout,
        env=process_tree.unmarked(os.environ),
    )  # fmt: skip


@dataclass(frozen=True)
class Cluster:
    slurm_env: dict[str, str]  # merge into a subprocess's environment to reach the cluster
    work_root: Path  # shared by every node; make your own directory under it (workdir)
    nodes: list[str]  # node1..nodeN; each node's hostname is its name
    status: dict[str, Any]  # `cluster status --json` at session start

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, **self.slurm_env, **extra}

    def slurm(
        self, *argv: str, check: bool = True, timeout: float = 60, **kwargs: Any
    ) -> subprocess.CompletedProcess:
        """Run a Slurm command (sbatch, squeue, sacct, scontrol, srun) against the cluster."""
        done = subprocess.run(
            list(argv),
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            **kwargs,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}"
            )
        return done

    def sbatch(self, *argv: str) -> str:
        """Submit and return the job id (the array job id for an array)."""
        return self.slurm("sbatch", "--parsable", *argv).stdout.strip().split(";")[0]

    def workdir(self, name: str) -> Path:
        """A fresh owner-only directory under the shared work root, for one test."""
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.work_root))

    def sacct(self, job_id: str) -> list[dict[str, str]]:
        """One record per job or array task (no steps), as sacct reports them."""
        out = self.slurm(
            "sacct", "-X", "-n", "-P", "-j", job_id, "-o", ",".join(SACCT_FIELDS)
        ).stdout
        return [
            dict(zip(SACCT_FIELDS, line.split("|"), strict=True))
            for line in out.splitlines()
            if line
        ]

    def wait_finished(self, job_id: str, count: int, timeout: float) -> list[dict[str, str]]:
        """Wait until sacct holds `count` records of `job_id`, all in a final state."""

        def finished() -> list[dict[str, str]] | None:
            records = self.sacct(job_id)
            done = [r for r in records if r["State"].split()[0] in FINAL_STATES]
            return records if len(done) == count == len(records) else None

        return wait_until(finished, timeout, f"{count} record(s) of job {job_id} to finish", 0.5)

    def node_state(self, node: str) -> str:
        out = self.slurm("scontrol", "-o", "show", "node", node).stdout
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        return fields.get("State", "")

    wait_until = staticmethod(wait_until)


def _status() -> dict[str, Any]:
    return json.loads(cluster_cli("status", "--json").stdout)


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true, but the local Slurm cluster cannot run: {reason}", pytrace=False)
    pytest.skip(f"the local Slurm cluster cannot run here: {reason}")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if os.geteuid() != 0:
        _unavailable("it needs root (network namespaces, daemons, /etc/hosts)")
    with cluster_lock(say=lambda line: print(line, file=sys.stderr)):
        up = cluster_cli("up", timeout=UP_TIMEOUT_S)
        sys.stderr.write(up.stderr)
        if up.returncode == 2:
            _unavailable(up.stderr.strip().splitlines()[-1])
        assert up.returncode == 0, f"cluster up failed:\n{up.stderr}"
        status = _status()
        assert status["up"], f"cluster up succeeded but status says: {status['reason']}"
        yield Cluster(
            slurm_env=dict(status["env"]),
            work_root=Path(status["work_root"]),
            nodes=[n["name"] for n in status["nodes"]],
            status=status,
        )
        if not KEEP:
            down = cluster_cli("down")
            assert down.returncode == 0, f"cluster down failed:\n{down.stderr}"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "disruptive: takes nodes or the whole cluster down; runs after every other test",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Tests that kill nodes or take the cluster down run last, so no other test's jobs
    # or work directories are caught in them. sort() is stable: order is kept otherwise.
    items.sort(key=lambda item: item.get_closest_marker("disruptive") is not None)
