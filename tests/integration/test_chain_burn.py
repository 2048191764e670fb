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
        records = tasks(cluster, array_job_id)
        assert {state(r) for r in records.values()} == {"CANCELLED"}
        assert not any(ran(r) for r in records.values())
    assert not (work / "chain.active").exists()
