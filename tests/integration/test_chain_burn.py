"""i) The burn guard stops a chain whose generations die before training."""

from __future__ import annotations

import pytest

from .chain_support import (
    ledger,
    logs_on_failure,
    ran,
    state,
    submit,
    tasks,
    unique,
    wait_idle,
    wait_ledger,
)
from .conftest import Cluster

pytestmark = pytest.mark.cluster


def test_two_generations_that_never_train_stop_the_rest_of_the_chain(cluster: Cluster):
    work = cluster.workdir("burn")
    name = unique("burn")
    # Every generation's only cycle fails at its first step, before any checkpoint, and
    # no restart is allowed: the shape of a bad image or a wrong setting.
    first, second, *rest = submit(
        cluster, work, name,
        "--mode", "handoff", "--gpu-failure", "", "--fault-delay", "0", "--max-restarts", "0",
        "--train-tasks", "1", "--hot-spares", "0", "--depth", "4", "--burn-guard", "2",
    )  # fmt: skip

    wait_ledger(work, 2, timeout=300)
    wait_idle(cluster, name, timeout=60)

    entries = ledger(work)
    assert [e["array_job_id"] for e in entries] == [first, second], logs_on_failure(work)
    assert all(e["exit_code"] != 0 and e["checkpoint_iteration"] is None for e in entries)
    assert entries[0]["action"] == "released_spares"
    assert entries[1]["action"] == "burn_guard"
    assert "2 consecutive generations ended without training" in entries[1]["reason"]
    for array_job_id in rest:
        # squeue, the controller's live view, lists nothing of the chain (wait_idle): the
        # burn guard left no generation queued. Accounting learns of a pending job's
        # cancellation from the controller's queue to slurmdbd, a while later on a fresh
        # machine (CI saw a later generation still PENDING in sacct here): read it until
        # it has caught up.
        records = cluster.wait_until(
            lambda job=array_job_id: _all_cancelled(tasks(cluster, job)), 120,
            f"accounting to record generation {array_job_id} cancelled", 1.0,
        )  # fmt: skip
        assert not any(ran(r) for r in records.values()), records
    assert not (work / "chain.active").exists()


def _all_cancelled(records: dict[int, dict[str, str]]) -> dict[int, dict[str, str]] | None:
    return records if records and {state(r) for r in records.values()} == {"CANCELLED"} else None
