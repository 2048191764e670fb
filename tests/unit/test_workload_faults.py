"""The cpu trainer's fault plan: which rank, which kind, which cycle, when."""

from __future__ import annotations

import pytest

from nvrx_appliance.exitcodes import NVRX_NO_RESTART
from nvrx_appliance.workloads.faults import EXIT_CODE, due, fault_for, parse_plan


def test_no_ranks_means_no_plan():
    assert parse_plan("", "exception", 10.0, 0) is None


def test_only_the_named_ranks_fault():
    plan = parse_plan("1,3", "exception", 10.0, 0)
    assert [r for r in range(5) if fault_for(plan, r, cycle=0)] == [1, 3]


def test_kinds_rotate_by_cycle():
    plan = parse_plan("0", "exception,exit,hang", 0.0, 0)
    assert [fault_for(plan, 0, c) for c in range(4)] == ["exception", "exit", "hang", "exception"]


def test_cycle_limit_lets_later_cycles_train():
    plan = parse_plan("1", "exception", 0.0, 1)
    assert fault_for(plan, 1, 0) == "exception"
    assert fault_for(plan, 1, 1) is None


def test_fault_is_due_once_the_delay_has_passed_since_training_started():
    plan = parse_plan("1", "hang", 30.0, 0)
    assert not due(plan, 29.9)
    assert due(plan, 30.0)


@pytest.mark.parametrize(
    ("ranks", "kinds", "delay", "cycles", "flag"),
    [
        ("one", "exception", 1.0, 0, "--fault-injector-ranks"),
        ("1", "crash", 1.0, 0, "--fault-injector-fault-types"),
        ("1", "", 1.0, 0, "--fault-injector-fault-types"),
        ("1", "exit", -1.0, 0, "--fault-injector-fault-delay"),
        ("1", "exit", 1.0, -1, "--fault-injector-cycles"),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(ranks, kinds, delay, cycles, flag):
    with pytest.raises(ValueError, match=flag):
        parse_plan(ranks, kinds, delay, cycles)


def test_hard_exit_never_uses_nvrx_no_restart_code():
    assert EXIT_CODE not in (0, NVRX_NO_RESTART)
