"""The health-check hand-off's figures, from the artefacts one generation leaves behind:
here the lines NVRx 0.7.0 wrote in a demo run on the local cluster before the early close
(its log server waited out a 5 s drain with the hot spare's launcher still connected)."""

from __future__ import annotations

import pytest

from bench import healthcheck
from bench.report import Result
from tests.unit.test_bench_extract import task

LAUNCHER = (
    "2026-12-03 07:34:01,126 [INFO] [node2] [workload:?(?) infra:1(0)] launcher.py:1728 "
    "Job array deployment: exiting with code 1 for replacement.\n"  # a peer's: in-job
    "2026-12-03 07:34:02,129 [INFO] [node1] [workload:?(?) infra:0(0)] launcher.py:1728 "
    "Job array deployment: exiting with code 1 for replacement.\n"
    "2026-12-03 07:34:02,138 [INFO] [node1] [workload:?(?) infra:0(0)] launcher.py:1775 "
    "Store host waiting 3.0 seconds before exit to allow other nodes to read final TCPStore "
    "state...\n"
)
SERVER = (
    "2026-12-03 07:34:05,746 [INFO] [28058] grpc_log_server.py:807 Received signal 15, "
    "initiating graceful shutdown...\n"
    "2026-12-03 07:34:10,752 [WARNING] [28058] grpc_log_server.py:641 Graceful shutdown "
    "timeout (5.0s) reached with 1 client(s) still connected. Proceeding with shutdown.\n"
    "2026-12-03 07:34:10,753 [INFO] [28058] grpc_log_server.py:719 Server shutdown complete. "
    "Total: 139 chunks, 0.0 MB\n"
)


def seen(**changes):
    at = healthcheck.local
    fields = {
        "launcher_log": LAUNCHER,
        "server_log": SERVER,
        "task0_host": "node1",
        "trap_closed": at("2026-12-03 07:34:16,145"),
        "generation": [
            task("1", 0, at("2026-12-03 07:33:47,000"), at("2026-12-03 07:34:16,400")),
            task(
                "1", 1, at("2026-12-03 07:33:47,000"), at("2026-12-03 07:34:16,900"), node="node2"
            ),
        ],
        "successor": [task("2", 0, at("2026-12-03 07:34:17,900"), None, node="node2")],
        "resumed": {"time": at("2026-12-03 07:34:21,000")},
        "first_step": {"time": at("2026-12-03 07:34:21,500")},
    }
    return healthcheck.Seen(**{**fields, **changes})


def test_the_dying_path_is_cut_at_nvrxs_decision_its_waits_and_slurms_end():
    sample = healthcheck.sample(seen())
    assert sample["dying_s"] == pytest.approx(16.9 - 2.129)  # task 0's line, not node2's
    assert sample["phases"] == {
        "NVRx: store-host grace (3.0 s) and launcher cleanup": pytest.approx(3.617),
        "NVRx: log server drain": pytest.approx(5.007),
        # gRPC's stop waited 5 s more for the open stream: no line says so
        "ft_launcher's exit, task 0's entrypoint and srun ending": pytest.approx(5.392),
        "teardown, relay, Slurm's step end": pytest.approx(0.755),
        "scheduler (the floor's part)": pytest.approx(1.0),
        "successor's start-up and checkpoint restore": pytest.approx(3.1),
        "first step": pytest.approx(0.5),
    }
    assert sum(sample["phases"].values()) == pytest.approx(sample["total_s"])
    assert sample["drain_timed_out"] is True


def test_a_generation_without_task_0s_decision_is_no_sample():
    with pytest.raises(healthcheck.Incomplete, match="NVRx's decision line"):
        healthcheck.sample(seen(task0_host="node3"))


def test_the_figures_hold_the_dying_path_against_its_target():
    result = Result(healthcheck.NAME, healthcheck.TITLE, samples=[healthcheck.sample(seen())])
    healthcheck.finish(result, floor=1.0)
    after = next(m for m in result.metrics if m.label.startswith("of which after NVRx"))
    assert after.target_s == 1.0 and after.samples == [pytest.approx(16.9 - 10.753)]
    assert "waited out its drain with a client connected: 1 of 1" in result.notes[0]
