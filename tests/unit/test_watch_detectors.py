"""The detectors, over snapshots built in memory: each fires at its threshold and not one
below, and stays silent when its preconditions do not hold."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from nvrx_appliance.observe import deaths, run_files
from nvrx_appliance.observe.hangs import Hang
from nvrx_appliance.observe.types import Checkpoint, Cycle, Ending, Generation, LedgerEntry, Task
from nvrx_appliance.watch import detectors, finding_counts
from nvrx_appliance.watch.config import Thresholds
from nvrx_appliance.watch.findings import (
    CANCEL_GENERATION,
    CHECKPOINT,
    CRITICAL,
    CYCLES,
    LEDGER,
    MARKER,
    NOT_CONFIGURED,
    OBSERVED,
    RELEASE_SPARES,
    SLURM,
    UNAVAILABLE,
    Run,
    Snapshot,
    SourceStatus,
)

NOW = 1_800_000_000.0
T = Thresholds()
RUN = Run(
    job_name="chain-a", owner="alice", work_dir="/shared/alice/run", max_restarts=10,
    train_tasks=2, spares=2,
)  # fmt: skip


def snapshot(**kw) -> Snapshot:
    sources = {s: SourceStatus(OBSERVED) for s in (SLURM, CYCLES, CHECKPOINT, LEDGER, MARKER)}
    sources.update(kw.pop("sources", {}))
    base = dict(run=RUN, observed_at=NOW, caller="alice", sources=sources)
    base.update(kw)
    return Snapshot(**base)


def gen(
    array_job_id: str, *states: str, task0: bool = True, submitted: float | None = None
) -> Generation:
    """A generation whose tasks have the given states, task 0 first (unless task0=False)."""
    first = 0 if task0 else 1
    tasks = tuple(
        Task(
            task_id=first + i,
            job_id=f"{array_job_id}{i}",
            state=s,
            user="alice",
            nodes=f"node{i + 1}" if s == "RUNNING" else "",
        )
        for i, s in enumerate(states)
    )
    return Generation(array_job_id=array_job_id, tasks=tasks, submitted=submitted)


def ended(array_job_id: str, ago: float, code: int = 0, state: str = "FAILED") -> Ending:
    return Ending(
        array_job_id=array_job_id, state=state, exit_code=code, end=NOW - ago, source="sacct"
    )


def cycle(
    number: int,
    start_ago: float,
    length: float | None,
    job: str = "100",
    nodes: str = "node[1-2]",
    standby: str = "",
) -> Cycle:
    start = NOW - start_ago
    return Cycle(
        job_id=job,
        attempt=0,
        number=number,
        start=start,
        end=None if length is None else start + length,
        active_nodes=nodes,
        standby_nodes=standby,
    )


def names(findings) -> list[str]:
    return [f.detector for f in findings]


# --- orphaned_generation ----------------------------------------------------------------------


def test_orphaned_generation_fires_at_the_grace_period_with_the_scancel_command():
    snap = snapshot(
        generations=(gen("100", "PENDING", "PENDING", task0=False),),
        endings=(ended("100", T.grace),),
    )
    [finding] = detectors.orphaned_generation(snap, T)
    assert finding.severity == "warning"
    assert finding.action.kind == RELEASE_SPARES
    assert finding.action.command == "scancel --state=PENDING --user=alice --name=chain-a 100"
    assert finding.action.command in finding.detail
    assert "2 cold spare(s)" in finding.summary


def test_orphaned_generation_waits_for_a_trap_that_may_still_be_running():
    snap = snapshot(
        generations=(gen("100", "PENDING", task0=False),), endings=(ended("100", T.grace - 1),)
    )
    assert detectors.orphaned_generation(snap, T) == []


def test_orphaned_generation_treats_sacct_silence_as_unknown_never_as_gone():
    snap = snapshot(generations=(gen("100", "PENDING", task0=False),), endings=())
    assert detectors.orphaned_generation(snap, T) == []


def test_orphaned_generation_is_silent_while_task0_is_still_queued():
    snap = snapshot(
        generations=(gen("100", "RUNNING", "PENDING"),), endings=(ended("100", 10 * T.grace),)
    )
    assert detectors.orphaned_generation(snap, T) == []


def test_orphaned_generation_is_silent_when_no_spare_is_pending():
    snap = snapshot(
        generations=(gen("100", "RUNNING", task0=False),), endings=(ended("100", 10 * T.grace),)
    )
    assert detectors.orphaned_generation(snap, T) == []


# --- stranded_generation ----------------------------------------------------------------------


def test_stranded_generation_fires_when_spares_still_run_past_the_grace_period():
    snap = snapshot(
        generations=(gen("100", "RUNNING", "RUNNING", "PENDING", task0=False),),
        endings=(ended("100", T.grace),),
    )
    [finding] = detectors.stranded_generation(snap, T)
    assert finding.severity == CRITICAL
    assert finding.action.kind == CANCEL_GENERATION
    assert finding.action.argv == ("scancel", "--user=alice", "--name=chain-a", "100")
    assert "node1,node2" in finding.summary
    assert finding.nodes == ("node1", "node2")  # the per-node gauge names each


def test_stranded_generation_one_second_before_the_grace_period_is_silent():
    snap = snapshot(
        generations=(gen("100", "RUNNING", task0=False),), endings=(ended("100", T.grace - 1),)
    )
    assert detectors.stranded_generation(snap, T) == []


def test_stranded_generation_needs_a_task_that_runs():
    snap = snapshot(
        generations=(gen("100", "PENDING", task0=False),), endings=(ended("100", 10 * T.grace),)
    )
    assert detectors.stranded_generation(snap, T) == []


def test_stranded_generation_is_silent_while_task0_runs():
    snap = snapshot(generations=(gen("100", "RUNNING", "RUNNING"),), endings=())
    assert detectors.stranded_generation(snap, T) == []


# --- chain_exhausted / chain_not_cancelled / generation_churn -------------------------------------


def test_chain_exhausted_fires_when_nothing_is_queued_but_the_marker_exists():
    ledger = (LedgerEntry("99", NOW - 60, 1, "released_spares", "task 0 ended with exit 1"),)
    [finding] = detectors.chain_exhausted(snapshot(chain_marker=True, ledger=ledger), T)
    assert finding.severity == CRITICAL
    assert "chain.active" in finding.detail and "99" in finding.detail


def test_chain_exhausted_is_silent_without_the_marker_or_with_a_queued_generation():
    assert detectors.chain_exhausted(snapshot(chain_marker=False), T) == []
    assert (
        detectors.chain_exhausted(
            snapshot(chain_marker=True, generations=(gen("101", "PENDING"),)), T
        )
        == []
    )


def test_chain_not_cancelled_fires_for_successors_queued_before_a_93():
    snap = snapshot(
        generations=(
            gen("101", "PENDING", submitted=NOW - 3600),
            gen("102", "PENDING", submitted=NOW - 3600),
        ),
        endings=(ended("100", 60, code=93),),
    )
    [finding] = detectors.chain_not_cancelled(snap, T)
    assert finding.severity == CRITICAL
    assert "101, 102" in finding.summary
    assert "scancel --state=PENDING --user=alice --name=chain-a" in finding.detail


def test_chain_not_cancelled_reads_the_verdict_from_the_ledger_too():
    snap = snapshot(
        generations=(gen("101", "PENDING", submitted=NOW - 3600),),
        ledger=(LedgerEntry("100", NOW - 60, 93, "cancelled_chain", "no restart"),),
    )
    assert names(detectors.chain_not_cancelled(snap, T)) == ["chain_not_cancelled"]


def test_chain_not_cancelled_ignores_other_exit_codes_and_later_resubmissions():
    queued = (gen("101", "PENDING", submitted=NOW - 3600),)
    assert (
        detectors.chain_not_cancelled(
            snapshot(generations=queued, endings=(ended("100", 60, code=92),)), T
        )
        == []
    )
    resubmitted = (gen("105", "PENDING", submitted=NOW - 10),)
    assert (
        detectors.chain_not_cancelled(
            snapshot(generations=resubmitted, endings=(ended("100", 60, code=93),)), T
        )
        == []
    )


def test_chain_not_cancelled_is_silent_when_only_the_ended_generation_drains():
    snap = snapshot(
        generations=(gen("100", "PENDING", task0=False),), endings=(ended("100", 60, code=93),)
    )
    assert detectors.chain_not_cancelled(snap, T) == []


def completed(array_job_id: str, ago: float) -> LedgerEntry:
    reason = "training completed at iteration 200; cancelling every queued generation"
    return LedgerEntry(array_job_id, NOW - ago, 0, "completed", reason, final_iteration=200)


def test_a_chain_whose_training_completed_is_finished_not_exhausted():
    # The marker normally goes with the completion; even where its removal failed, a
    # completed chain with nothing queued pages nobody, however many generations ended.
    snap = snapshot(chain_marker=True, ledger=(completed("104", 60),), endings=_endings(9))
    assert snap.finished
    assert detectors.chain_exhausted(snap, T) == []
    assert names(detectors.run(snap, T)) == []
    resubmitted = replace(snap, generations=(gen("105", "PENDING", submitted=NOW - 10),))
    assert not resubmitted.finished  # trained further: watched again


def test_chain_not_cancelled_fires_for_generations_queued_past_a_completed_training():
    snap = snapshot(
        generations=(gen("105", "PENDING", submitted=NOW - 3600),),
        ledger=(completed("104", 60),),
    )
    [finding] = detectors.chain_not_cancelled(snap, T)
    assert "generation 104 of chain-a completed training but generation(s) 105" in finding.summary
    assert "scancel --state=PENDING --user=alice --name=chain-a" in finding.detail


def _endings(count: int, spacing: float = 60.0) -> tuple[Ending, ...]:
    return tuple(ended(str(100 + i), (i + 1) * spacing) for i in range(count))


def test_generation_churn_fires_one_past_the_allowed_count():
    limit = T.max_generations_per_window
    assert detectors.generation_churn(snapshot(endings=_endings(limit)), T) == []
    [finding] = detectors.generation_churn(snapshot(endings=_endings(limit + 1)), T)
    assert f"{limit + 1} generations" in finding.summary


def test_generation_churn_counts_only_inside_the_window_and_once_per_generation():
    old = ended("90", T.churn_window + 1)
    ledger = tuple(LedgerEntry(e.array_job_id, e.end, 1, "none", "") for e in _endings(3))
    snap = snapshot(endings=(*_endings(3), old), ledger=ledger)
    assert detectors.generation_churn(snap, T) == []


# --- restart anomalies --------------------------------------------------------------------------


def _storm(count: int) -> tuple[Cycle, ...]:
    return tuple(cycle(i, T.storm_window - 1 - i, 30) for i in range(count))


def test_restart_storm_at_its_threshold_and_one_below():
    assert detectors.restart_storm(snapshot(cycles=_storm(T.storm_cycles - 1)), T) == []
    [finding] = detectors.restart_storm(snapshot(cycles=_storm(T.storm_cycles)), T)
    assert finding.key == "nvrx/alice/chain-a/restart_storm/100"


def test_restart_storm_ignores_cycles_outside_the_window_and_of_older_generations():
    outside = tuple(cycle(i, T.storm_window + 10 + i, 5) for i in range(T.storm_cycles))
    assert detectors.restart_storm(snapshot(cycles=outside), T) == []
    older = tuple(cycle(i, 100 - i, 5, job="99") for i in range(T.storm_cycles - 1))
    snap = snapshot(cycles=(*older, cycle(0, 10, None, job="100")))
    assert detectors.restart_storm(snap, T) == []


def _unproductive(count: int, *, since_ago: float = 5000) -> Snapshot:
    cycles = tuple(cycle(i, since_ago - 100 - 200 * i, 100) for i in range(count))
    cycles += (cycle(count, 50, None),)  # the open newest cycle never counts
    return snapshot(
        cycles=cycles,
        checkpoint=Checkpoint(value=400, mtime=NOW - since_ago, since=NOW - since_ago),
        generations=(gen("100", "RUNNING", "RUNNING"),),
    )


def test_stalled_progress_fires_after_stall_cycles_completed_without_a_new_checkpoint():
    assert detectors.stalled_progress(_unproductive(T.stall_cycles - 1), T) == []
    [finding] = detectors.stalled_progress(_unproductive(T.stall_cycles), T)
    assert finding.severity == CRITICAL and "iteration 400" in finding.summary


def test_stalled_progress_counts_cycles_of_earlier_generations_too():
    snap = _unproductive(T.stall_cycles)
    moved = tuple(c._replace(job_id="99") for c in snap.cycles[:-1]) + snap.cycles[-1:]
    assert names(detectors.stalled_progress(replace(snap, cycles=moved), T)) == ["stalled_progress"]


def test_stalled_progress_is_silent_once_the_chain_has_nothing_queued():
    snap = replace(_unproductive(T.stall_cycles + 2), generations=())
    assert detectors.stalled_progress(snap, T) == []


def test_stalled_progress_without_any_checkpoint():
    cycles = tuple(cycle(i, 1000 - 100 * i, 50) for i in range(T.stall_cycles))
    base = snapshot(cycles=(*cycles, cycle(9, 10, None)), generations=(gen("100", "RUNNING"),))
    [finding] = detectors.stalled_progress(base, T)
    assert "no checkpoint iteration was ever recorded" in finding.summary
    fewer = replace(base, cycles=(*cycles[1:], cycle(9, 10, None)))
    assert detectors.stalled_progress(fewer, T) == []


def _open_cycle(idle: float, **kw) -> Snapshot:
    base = dict(
        cycles=(cycle(0, 9 * 3600, 60), cycle(1, idle, None)),
        generations=(gen("100", "RUNNING", "RUNNING"),),
    )
    base.update(kw)
    return snapshot(**base)


def test_cycle_stalled_at_stall_seconds_and_one_below():
    assert detectors.cycle_stalled(_open_cycle(T.stall_seconds - 1), T) == []
    [finding] = detectors.cycle_stalled(_open_cycle(T.stall_seconds), T)
    assert finding.key == "nvrx/alice/chain-a/cycle_stalled/100.0.1"


def test_cycle_stalled_counts_a_new_checkpoint_as_movement():
    snap = _open_cycle(2 * T.stall_seconds, checkpoint=Checkpoint(10, NOW - 60, NOW - 60))
    assert detectors.cycle_stalled(snap, T) == []


def test_cycle_stalled_is_silent_for_a_finished_generation_whose_last_cycle_has_no_end_time():
    assert detectors.cycle_stalled(_open_cycle(10 * T.stall_seconds, generations=()), T) == []
    pending_only = (gen("100", "PENDING", task0=False),)
    assert (
        detectors.cycle_stalled(_open_cycle(10 * T.stall_seconds, generations=pending_only), T)
        == []
    )


def test_cycle_stalled_without_a_platform_is_best_effort():
    no_slurm = {SLURM: SourceStatus(NOT_CONFIGURED, "--platform none")}
    snap = _open_cycle(T.stall_seconds, generations=(), sources=no_slurm)
    assert names(detectors.cycle_stalled(snap, T)) == ["cycle_stalled"]


def test_restart_budget_low_at_its_fraction_and_one_below():
    threshold = int(RUN.max_restarts * T.budget_fraction)  # 8 of 10
    alive = (gen("100", "RUNNING"),)
    below = snapshot(cycles=(cycle(threshold - 1, 60, None),), generations=alive)
    at = snapshot(cycles=(cycle(threshold, 60, None),), generations=alive)
    assert detectors.restart_budget_low(below, T) == []
    assert names(detectors.restart_budget_low(at, T)) == ["restart_budget_low"]


def test_restart_budget_low_needs_a_known_budget_and_a_live_generation():
    at = snapshot(cycles=(cycle(9, 60, None),), generations=())
    assert detectors.restart_budget_low(at, T) == []
    unknown = replace(at, run=replace(RUN, max_restarts=None), generations=(gen("100", "RUNNING"),))
    assert detectors.restart_budget_low(unknown, T) == []


def test_spares_exhausted_when_no_standby_and_nothing_pending():
    snap = snapshot(cycles=(cycle(0, 60, None),), generations=(gen("100", "RUNNING", "RUNNING"),))
    [finding] = detectors.spares_exhausted(snap, T)
    assert finding.severity == "info"


def test_spares_exhausted_counts_standby_nodes_pending_spares_and_hot_spares_running():
    standby = snapshot(
        cycles=(cycle(0, 60, None, standby="node3"),),
        generations=(gen("100", "RUNNING", "RUNNING"),),
    )
    pending = snapshot(
        cycles=(cycle(0, 60, None),), generations=(gen("100", "RUNNING", "RUNNING", "PENDING"),)
    )
    hot = snapshot(
        cycles=(cycle(0, 60, None),), generations=(gen("100", "RUNNING", "RUNNING", "RUNNING"),)
    )
    for snap in (standby, pending, hot):
        assert detectors.spares_exhausted(snap, T) == []


def test_a_chain_given_no_spares_or_whose_spares_are_unknown_is_not_said_to_run_out():
    # Both fired every pass, forever, on a healthy chain: --hot-spares 0 --cold-spares 0
    # (allowed), and a chain watched by --work-dir without run.json.
    alone = dict(cycles=(cycle(0, 60, None),), generations=(gen("100", "RUNNING", "RUNNING"),))
    for spares in (0, None):
        snap = snapshot(run=replace(RUN, spares=spares), **alone)
        assert detectors.spares_exhausted(snap, T) == []
    assert detectors.spares_exhausted(snapshot(**alone), T) != []  # given 2, none left


def _short_cycles(count: int, nodes=("node[1-2]",)) -> tuple[Cycle, ...]:
    pattern = [nodes[i % len(nodes)] for i in range(count)]
    out = tuple(
        cycle(i, 5000 - 400 * i, T.short_cycle_seconds - 1, nodes=pattern[i]) for i in range(count)
    )
    return (cycle(99, 9000, 7200, nodes="node[5-6]"), *out, cycle(count + 100, 10, None))


def test_suspect_node_at_suspect_cycles_and_one_below():
    assert detectors.suspect_node(snapshot(cycles=_short_cycles(T.suspect_cycles - 1)), T) == []
    [finding] = detectors.suspect_node(snapshot(cycles=_short_cycles(T.suspect_cycles)), T)
    assert "node1, node2" in finding.summary
    assert finding.action is None  # a candidate for --exclude, never acted on


def test_suspect_node_needs_a_node_common_to_every_short_cycle():
    snap = snapshot(cycles=_short_cycles(T.suspect_cycles, nodes=("node[1-2]", "node[3-4]")))
    assert detectors.suspect_node(snap, T) == []


def test_suspect_node_ignores_cycles_that_were_long_enough():
    long_cycles = tuple(cycle(i, 9000 - 1000 * i, T.short_cycle_seconds) for i in range(5))
    assert detectors.suspect_node(snapshot(cycles=long_cycles), T) == []


# --- the registry ----------------------------------------------------------------------------------


def test_a_detector_whose_source_failed_is_skipped_not_run_on_partial_data():
    blind = {SLURM: SourceStatus(UNAVAILABLE, "squeue did not answer within 30s")}
    snap = snapshot(
        sources=blind, chain_marker=True, cycles=(cycle(1, 10 * T.stall_seconds, None),)
    )
    found = names(detectors.run(snap, T))
    assert "chain_exhausted" not in found  # no generations seen is not "no generations"
    assert "cycle_stalled" not in found  # liveness unknown: a stale open cycle is not a stall
    assert "source_unavailable" in found


def test_unreadable_cycle_files_keep_the_cycle_detectors_counts_not_zero():
    seen = snapshot(cycles=tuple(cycle(i, 600 - 60 * i, 30) for i in range(6)))
    storm = finding_counts.count(detectors.run(seen, T), detectors.blind_to(seen), None)
    assert storm.by_detector[("restart_storm", "warning")] == 1
    unreadable = snapshot(sources={CYCLES: SourceStatus(UNAVAILABLE, "permission denied")})
    blind = detectors.blind_to(unreadable)
    assert {"restart_storm", "stalled_progress", "cycle_stalled", "suspect_node"} <= blind
    assert "chain_exhausted" not in blind
    after = finding_counts.count(detectors.run(unreadable, T), blind, storm)
    assert after.by_detector[("restart_storm", "warning")] == 1  # carried, not 0
    assert after.by_detector[("chain_exhausted", "critical")] == 0  # it judged: none
    restored = finding_counts.from_json(after.to_json())
    assert restored == after  # as the state file keeps it between passes
    assert finding_counts.from_json({"detectors": [["x", "y", -1]], "nodes": []}) is None


def test_disabled_detectors_do_not_run():
    snap = snapshot(chain_marker=True)
    assert "chain_exhausted" in names(detectors.run(snap, T))
    assert "chain_exhausted" not in names(detectors.run(snap, T, frozenset({"chain_exhausted"})))


def test_dedup_keys_are_deterministic_across_passes():
    snap = snapshot(
        generations=(gen("100", "PENDING", task0=False),), endings=(ended("100", 1000),)
    )
    later = replace(snap, observed_at=NOW + 600)
    assert [f.key for f in detectors.run(snap, T)] == [f.key for f in detectors.run(later, T)]


@pytest.mark.parametrize("detector", detectors.ALL, ids=lambda d: d.name)
def test_every_threshold_a_detector_names_exists_with_a_reason(detector):
    fields = {f.name: f for f in __import__("dataclasses").fields(Thresholds)}
    for name in detector.thresholds:
        assert name in fields and len(fields[name].metadata["why"]) > 40


def test_stalled_progress_says_the_tracker_holds_junk_when_it_exists():
    cycles = tuple(cycle(i, 1000 - 100 * i, 50) for i in range(T.stall_cycles))
    base = snapshot(cycles=(*cycles, cycle(9, 10, None)), generations=(gen("100", "RUNNING"),))
    junk = replace(base, checkpoint=Checkpoint(value=None, mtime=NOW - 120))
    [finding] = detectors.stalled_progress(junk, T)
    assert "exists but holds no iteration number" in finding.detail
    assert "Expected" not in finding.detail


def test_a_tracker_of_superscript_digits_holds_no_iteration():
    assert run_files.tracker_value("²\n") is None and run_files.tracker_value(" 40\n") == 40


STOPPED = (
    "the workload's verdict: exit 17 at iteration 60: Megatron's result validation failed; "
    "no restart on the same GPUs can change it, so the chain stops"
)


def test_chain_stopped_pages_with_what_the_workload_did():
    ledger = (LedgerEntry("99", NOW - 60, 78, "stopped_by_workload", STOPPED),)
    [finding] = detectors.chain_stopped(snapshot(ledger=ledger), T)
    assert finding.severity == CRITICAL
    assert "exit 17 at iteration 60" in finding.summary and "resubmit" in finding.detail


def test_chain_stopped_names_the_workload_behind_nvrxs_93_and_is_silent_otherwise():
    told = ("ft_launcher exited 93: NVRx decided not to restart after the workload failed 4 "
            "times at iteration 60 with exit 1; cancelling every queued generation")  # fmt: skip
    [finding] = detectors.chain_stopped(
        snapshot(ledger=(LedgerEntry("99", NOW - 60, 93, "cancelled_chain", told),)), T
    )
    assert "failed 4 times at iteration 60 with exit 1" in finding.summary
    plain = (LedgerEntry("99", NOW - 60, 93, "cancelled_chain", "ft_launcher exited 93"),)
    assert detectors.chain_stopped(snapshot(ledger=plain), T) == []
    running = snapshot(ledger=(LedgerEntry("99", NOW, 78, "stopped_by_workload", STOPPED),),
                       generations=(gen("100", "RUNNING"),))  # fmt: skip
    assert detectors.chain_stopped(running, T) == []


def test_chain_not_cancelled_fires_for_generations_queued_past_a_workload_stop():
    snap = snapshot(
        generations=(gen("101", "PENDING", submitted=NOW - 3600),),
        ledger=(LedgerEntry("100", NOW - 60, 78, "stopped_by_workload", STOPPED),),
    )
    [finding] = detectors.chain_not_cancelled(snap, T)
    assert "stopped by the workload's verdict" in finding.summary


def _hang(nodes: tuple[str, ...], *, withdrawn: tuple[str, ...] = (), hand_off=False):
    words = (
        "node3 hung in cycle 2: its 2 ranks stopped in `_train_step` while the 4 others waited "
        "in `all_reduce`"
        if nodes
        else "no verdict in cycle 2: every rank stopped in its own code"
    )
    record = {"generation": "c/4343/", "cycle": 2}
    return Hang(2, nodes, words, hand_off, withdrawn, "2026-12-04T10:00:00Z", record)


def test_a_hung_node_is_a_finding_in_the_words_status_uses():
    run = replace(RUN, exclude_for=86400)
    found = detectors.node_hung(snapshot(run=run, hangs=(_hang(("node3",)),)), T)
    assert [f.summary for f in found] == [
        "node3 hung in cycle 2: its 2 ranks stopped in `_train_step` while the 4 others waited "
        "in `all_reduce`; kept out of the next rendezvous (a hot spare takes its place) and of "
        "this chain's generations for 24 h"
    ]
    handed = detectors.node_hung(snapshot(run=run, hangs=(_hang(("node3",), hand_off=True),)), T)
    assert "no free hot spare, so the generation handed off" in handed[0].summary


def test_a_dead_node_is_a_finding_per_node_in_the_words_status_uses():
    words = (
        "node2 stopped answering at 18:33:41 UTC; no reset, no exit: a silent death (no "
        "liveness beat for 10 s in cycle 0)"
    )
    record = {"node": "node2", "kind": "silent", "cycle": 0, "words": words,
              "time": "2026-12-06T18:33:52Z", "hand_off": False}  # fmt: skip
    death = deaths.parse(json.dumps(record))
    assert death is not None
    found = detectors.node_dead(snapshot(run=replace(RUN, exclude_for=86400), deaths=(death,)), T)
    [finding] = found
    assert finding.summary == (
        f"{words}; a hot spare took its place in the next cycle; kept out of this chain's "
        "generations for 24 h"
    )
    assert finding.nodes == ("node2",) and finding.severity == "warning"
    assert detectors.node_dead(snapshot(), T) == []


def test_the_workloads_own_stall_is_a_finding_in_the_words_of_the_hang_record():
    words = (
        "the workload stalled in cycle 2: rank 3 on node3 stood in its own code in "
        "`upload_metrics` (state S) while the 3 others waited in `all_reduce` for it; no node "
        "is at fault, none is kept out"
    )
    record = {"generation": "c/4343/", "cycle": 2, "verdict": "workload"}
    hang = Hang(2, (), words, False, (), "2026-12-04T10:00:00Z", record)
    found = detectors.workload_stalled(
        snapshot(run=replace(RUN, exclude_for=86400), hangs=(hang,)), T
    )
    assert [f.summary for f in found] == [words]
    assert detectors.node_hung(snapshot(hangs=(hang,)), T) == []
    assert detectors.workload_stalled(snapshot(hangs=(_hang(()), _hang(("node3",)))), T) == []


def test_no_verdict_and_a_withdrawn_verdict_are_no_finding():
    hangs = (_hang(()), _hang(("node3",), withdrawn=("node3",)))
    assert detectors.node_hung(snapshot(hangs=hangs), T) == []
