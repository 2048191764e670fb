"""Checkpoint names, the tracker's content and retention, as Megatron lays them out."""

from __future__ import annotations

from nvrx_appliance.checkpoints.checkpoint_dir import (
    expired,
    is_partial_dir,
    iteration_dir,
    parse_iteration_dir,
    partial_dir,
    tracker_text,
)
from nvrx_appliance.observe.run_files import tracker_value as parse_tracker


def test_iteration_dirs_use_megatron_names_and_round_trip():
    assert iteration_dir(20) == "iter_0000020"
    assert parse_iteration_dir(iteration_dir(1234567)) == 1234567
    assert parse_iteration_dir("iter_12") is None
    assert parse_iteration_dir("latest_checkpointed_iteration.txt") is None


def test_a_partial_checkpoint_is_never_mistaken_for_a_complete_one():
    name = partial_dir(20)
    assert is_partial_dir(name)
    assert parse_iteration_dir(name) is None
    assert not is_partial_dir(iteration_dir(20))


def test_tracker_round_trips_and_foreign_content_is_no_iteration():
    assert parse_tracker(tracker_text(40)) == 40
    assert parse_tracker("") is None
    assert parse_tracker("release\n") is None


def test_retention_keeps_the_newest_n_up_to_the_tracked_one():
    assert expired([10, 20, 30, 40], latest=40, keep=2, complete={10, 20, 30, 40}) == [10, 20]


def test_retention_zero_keeps_every_checkpoint_of_the_timeline():
    assert expired([10, 20, 30], latest=30, keep=0, complete={10, 20, 30}) == []


def test_checkpoints_newer_than_the_tracker_belong_to_an_abandoned_timeline():
    # Resumed from 20 after a kill that left an untracked 30; now 25 is tracked.
    assert expired([10, 20, 25, 30], latest=25, keep=0, complete={10, 20, 25}) == [30]
    assert expired([10, 20, 25, 30], latest=25, keep=2, complete={10, 20, 25}) == [10, 30]


def test_the_tracked_checkpoint_is_never_expired():
    assert expired([40], latest=40, keep=1, complete={40}) == []
