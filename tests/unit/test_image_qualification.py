"""Judging a hand-off demo the way NVRx's guide asks, and the record that results."""

from __future__ import annotations

from nvrx_appliance.image import qualification as q
from tests.unit.images import cpu_manifest

FIRST, SECOND = "101", "102"


def _ledger(exit_code=1, iteration=10, action="released_spares"):
    return [
        {
            "array_job_id": FIRST,
            "exit_code": exit_code,
            "checkpoint_iteration": iteration,
            "action": action,
        }
    ]


def _events(resume_at=10, later=15):
    return [
        {"event": "checkpoint", "iteration": 5, "time": 1.0},
        {"event": "checkpoint", "iteration": 10, "time": 2.0},
        {"event": "fault", "kind": "exception", "rank": 1, "cycle": 0, "time": 3.0},
        {"event": "start", "iteration": resume_at, "slurm_array_job_id": SECOND, "time": 10.0},
        {"event": "checkpoint", "iteration": later, "time": 12.0},
    ]


def _evidence(**overrides) -> q.Evidence:
    values = dict(
        first=FIRST,
        second=SECOND,
        ledger=_ledger(),
        events=_events(),
        megatron_resumed=None,
        tracker=15,
        chain_live=True,
    )
    values.update(overrides)
    return q.Evidence(**values)


def test_a_clean_hand_off_passes_all_three_checks():
    checks = q.judge(_evidence())
    assert [c.name for c in checks] == [
        q.CHECKPOINT_BEFORE_FAULT,
        q.RESUMED_EXACTLY,
        q.TRAINING_WENT_ON,
    ]
    assert q.verdict(checks) == "passed", checks


def test_a_successor_that_resumes_elsewhere_fails():
    checks = q.judge(_evidence(events=_events(resume_at=5)))
    assert q.verdict(checks) == "failed"
    assert "resumed at 5, not 10" in checks[1].detail


def test_exit_93_instead_of_a_hand_off_fails():
    checks = q.judge(_evidence(ledger=_ledger(exit_code=93, action="cancelled_chain")))
    assert q.verdict(checks) == "failed"
    assert "93" in checks[0].detail


def test_a_generation_that_never_checkpointed_fails():
    assert q.verdict(q.judge(_evidence(ledger=_ledger(iteration=None)))) == "failed"


def test_while_the_successor_has_not_started_the_verdict_is_pending():
    events = [e for e in _events() if e["event"] != "start"][:3]
    checks = q.judge(_evidence(events=events, tracker=10))
    assert q.verdict(checks) == "pending"
    assert checks[0].passed is True and checks[1].passed is None


def test_pending_checks_fail_once_the_chain_is_gone():
    events = [e for e in _events() if e["event"] != "start"][:3]
    checks = q.judge(_evidence(events=events, tracker=10, chain_live=False))
    assert q.verdict(checks) == "failed"
    assert checks[1].detail.startswith("the chain ended first")


def test_no_checkpoint_after_the_resume_keeps_training_went_on_open_then_times_out():
    events = _events()[:-1]
    checks = q.judge(_evidence(events=events, tracker=10))
    assert q.verdict(checks) == "pending"
    assert q.verdict(q.timed_out(checks, 60)) == "failed"


def test_megatron_is_judged_from_its_own_loaded_checkpoint_line():
    log = (
        "x\n successfully loaded checkpoint from /w/checkpoints [ t 1/1, p 1/1 ] at iteration 10\n"
    )
    resumed = q.megatron_resumed_iteration(log)
    assert resumed == 10
    checks = q.judge(_evidence(events=[], megatron_resumed=resumed, tracker=20))
    assert q.verdict(checks) == "passed"


def test_a_passed_record_vouches_only_for_the_same_combination():
    record = q.record(
        image="/images/x.sqsh",
        image_manifest=cpu_manifest(),
        checks=q.judge(_evidence()),
        cluster={},
        chain={},
        started="a",
        finished="b",
        tool_version="0.1.0",
    )
    assert record["result"] == "passed"
    assert q.matches(record, cpu_manifest())
    # Rebuilt with another PyTorch: the same file name may hold another combination.
    assert not q.matches(record, cpu_manifest(pytorch="2.14.0+cpu"))
    # A rebuild at another time is still the same combination.
    assert q.matches(record, {**cpu_manifest(), "built": "later"})


def test_the_record_sits_next_to_the_image():
    assert str(q.record_path("/images/a.sqsh")) == "/images/a.sqsh.qualification.json"


def test_progress_while_waiting_tells_the_hand_off_as_it_happens():
    events = _events()
    lines = [
        q.progress(_evidence(ledger=[], events=[], tracker=None)),
        q.progress(_evidence(ledger=[], events=events[:2], tracker=10)),
        q.progress(_evidence(ledger=[], events=events[:3], tracker=10)),
        q.progress(_evidence(events=events[:3], tracker=10)),
        q.progress(_evidence(tracker=15)),
    ]
    assert lines == [
        "waiting for generation 101 to train; last checkpoint: none yet",
        "generation 101 training; last checkpoint: iteration 10",
        "fault injected in generation 101; waiting for the hand-off; last checkpoint: iteration 10",
        "generation 101 ended; waiting for 102 to start; last checkpoint: iteration 10",
        "generation 102 resumed; last checkpoint: iteration 15",
    ]


def test_qualify_says_on_which_nodes_stacks_cannot_be_sampled_and_why():
    why = "py-spy cannot read the workload (py-spy said: Operation not permitted (os error 1)); ..."
    samples = [
        {"node": "node1", "frames": [{"name": "all_reduce"}]},
        {"node": "node2", "frames": [], "unreadable": why, "no_stacks": why},
        {"node": "node3", "frames": [], "unreadable": "py-spy took over 10 s"},  # passing
        {"node": "node3", "frames": [{"name": "_train_step"}]},
    ]
    found = q.stack_sampling(samples)
    assert found == {"sampled": ["node1", "node3"], "refused": {"node2": why}}
    assert q.stack_lines(found) == [
        f"stacks cannot be sampled on node2: {why}",
        "stacks sampled on node1, node3",
    ]
    assert q.stack_lines(q.stack_sampling([])) == [
        "no stacks were sampled (--stack-sampling 0, or no rank ran long enough)"
    ]
