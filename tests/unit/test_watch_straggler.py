"""The watcher names a straggler of the running generation, in a finding and a gauge."""

from __future__ import annotations

from nvrx_appliance.goodput import straggler
from nvrx_appliance.observe.training_log import CycleWork, OwnSteps
from nvrx_appliance.watch import detectors, finding_counts, sinks
from nvrx_appliance.watch.findings import NOT_CONFIGURED, TRAINING, WARNING, SourceStatus

from .test_watch_detectors import T, gen, snapshot

SLOW = {"node1": 0.1, "node2": 0.1, "node3": 0.25}


def slow_node3(generation: str = "100") -> tuple[straggler.Straggler, ...]:
    own = [OwnSteps(1000.0 + i, 10 * (i + 1), 10, SLOW) for i in range(12)]
    return tuple(straggler.judge(CycleWork(generation, 1, "progress log", own_steps=own)))


def test_a_straggler_of_the_running_generation_is_a_warning_naming_the_node():
    snap = snapshot(generations=(gen("100", "RUNNING", "RUNNING"),), stragglers=slow_node3())
    [found] = detectors.straggler(snap, T)
    assert found.severity == WARNING
    assert found.summary.startswith(
        "node3 is a straggler in cycle 1 of generation 100: its own step takes 250 ms "
        "against 100 ms on its peers (2.50x over the last 120 steps)"
    )
    assert "the whole run trains at this node's pace" in found.detail


def test_a_straggler_of_a_generation_that_has_ended_is_no_finding():
    snap = snapshot(generations=(gen("101", "RUNNING"),), stragglers=slow_node3("100"))
    assert detectors.straggler(snap, T) == []


def counted(*findings):
    """The findings gauges of a pass that judged every detector."""
    return finding_counts.count(findings, frozenset(), None)


def test_the_gauges_carry_the_slowdown_and_the_time_lost_zero_when_nobody_is_slow():
    figures = sinks.PassFigures(counted(), 0.1, False)
    named = snapshot(sources={TRAINING: SourceStatus("observed")}, stragglers=slow_node3())
    text = sinks.metrics_text(named, figures)
    assert 'nvrx_watch_straggler_slowdown{chain="chain-a",owner="alice"} 2.5' in text
    assert 'nvrx_watch_straggler_lost_seconds{chain="chain-a",owner="alice"} 18' in text
    quiet = sinks.metrics_text(snapshot(sources={TRAINING: SourceStatus("observed")}), figures)
    assert 'nvrx_watch_straggler_slowdown{chain="chain-a",owner="alice"} 0' in quiet
    blind = sinks.metrics_text(snapshot(sources={TRAINING: SourceStatus(NOT_CONFIGURED)}), figures)
    assert 'nvrx_watch_straggler_slowdown{chain="chain-a",owner="alice"} NaN' in blind


def test_the_node_a_finding_names_is_a_series_of_its_own_and_leaves_with_the_finding():
    snap = snapshot(
        generations=(gen("100", "RUNNING", "RUNNING"),),
        sources={TRAINING: SourceStatus("observed")},
        stragglers=slow_node3(),
    )
    figures = sinks.PassFigures(counted(*detectors.straggler(snap, T)), 0.1, False)
    text = sinks.metrics_text(snap, figures)
    assert (
        'nvrx_watch_node_findings{chain="chain-a",owner="alice",detector="straggler",'
        'node="node3"} 1'
    ) in text
    quiet = sinks.metrics_text(snap, sinks.PassFigures(counted(), 0.1, False))
    assert "# TYPE nvrx_watch_node_findings gauge" in quiet
    assert "nvrx_watch_node_findings{" not in quiet
