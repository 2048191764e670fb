"""The peer gate as a state machine: what a node does for each state of the control dir."""

import json
import multiprocessing
import os

import pytest

from nvrx_appliance import exitcodes
from nvrx_appliance.layout import ControlFiles
from nvrx_appliance.node import control, controldir, detect, gate
from nvrx_appliance.node.identity import Node
from tests.unit import entrypoint_support as support

UID = 1000
LIMITS = gate.Limits(record_wait=300, lease_stale_after=60)
GB200 = detect.Fabric("6c1e2a07-93d4-4b58-a1f0-2d7e5b9c4e11", "all 4 GPUs report it")
NO_FABRIC = detect.unavailable("nvidia-smi is not on PATH")


def peer(fabric=NO_FABRIC, names=("node2", "10.0.0.2")) -> gate.Peer:
    node = Node(array_job_id="4242", task_id=1, node_id=0, job_id="4244", hostname="node2")
    return gate.Peer(node=node, uid=UID, own_names=frozenset(names), fabric=fabric)


record = support.record

OK_DIR = gate.DirSeen(mode=0o40700, owner=UID, is_dir=True)


def seen(*, closed=False, lease_age=None, text=None, owner=UID, directory=OK_DIR):
    published = None if text is None else gate.FileSeen(text=text, owner=owner, is_file=True)
    return gate.Observation(
        directory=directory, closed=closed, lease_age=lease_age, record=published
    )


def decide(observation, *, state=None, now=1000.0, who=None):
    return gate.step(state or gate.Waiting(), observation, now, who or peer(), LIMITS)


def test_a_published_record_with_a_live_lease_is_joined():
    _, decision = decide(seen(lease_age=2, text=control.encode(record())))
    assert decision == gate.Join(record())


def test_a_closed_flag_means_task_0_is_gone():
    _, decision = decide(seen(closed=True))
    assert decision.exit_code == exitcodes.TASK0_GONE


def test_the_closed_flag_wins_over_a_published_record():
    _, decision = decide(seen(closed=True, lease_age=2, text=control.encode(record())))
    assert decision.exit_code == exitcodes.TASK0_GONE
    assert "closed flag" in decision.message


def test_no_lease_and_no_record_waits_without_a_timeout():
    # A day later, still waiting: the scheduler may start task 0 long after its peers.
    state, decision = decide(seen(), now=86_400.0)
    assert isinstance(decision, gate.Wait)
    assert state.task0_started_at is None


def test_once_task_0_started_its_record_wait_is_bounded():
    state, first = decide(seen(lease_age=1), now=1000.0)
    assert isinstance(first, gate.Wait)
    _, still = decide(seen(lease_age=1), state=state, now=1299.0)
    assert isinstance(still, gate.Wait)
    _, late = decide(seen(lease_age=1), state=state, now=1301.0)
    assert late.exit_code == exitcodes.RECORD_TIMEOUT


def test_an_empty_record_is_not_a_host():
    _, decision = decide(seen(lease_age=1, text=""))
    assert isinstance(decision, gate.Wait)
    assert "empty" in decision.reason


def test_a_record_without_a_lease_is_never_joined():
    _, decision = decide(seen(text=control.encode(record())))
    assert isinstance(decision, gate.Wait)
    assert "no lease" in decision.reason


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{half", "not valid JSON"),
        ('{"host": "node1"}', "schema"),
        (control.encode(record(host="no_underscores")), "not a valid host name"),
        (control.encode(record(host="localhost")), "localhost"),
        (control.encode(record(host="127.0.0.1")), "loopback"),
        (control.encode(record(port=0)), "port"),
        (control.encode(record(port=70000)), "port"),
        (control.encode(record(segment=0)), "segment"),
        (control.encode(record(array_job_id="4000")), "array job 4000"),
    ],
)
def test_a_record_with_bad_content_is_refused(text, why):
    _, decision = decide(seen(lease_age=1, text=text))
    assert decision.exit_code == exitcodes.RECORD_REFUSED
    assert why in decision.message


def test_a_record_owned_by_another_user_is_refused():
    _, decision = decide(seen(lease_age=1, text=control.encode(record()), owner=UID + 1))
    assert decision.exit_code == exitcodes.RECORD_REFUSED
    assert "not by this job's user" in decision.message


@pytest.mark.parametrize("mode", [0o40777, 0o40770, 0o40722])
def test_a_group_or_world_writable_control_dir_is_refused(mode):
    directory = gate.DirSeen(mode=mode, owner=UID, is_dir=True)
    _, decision = decide(seen(lease_age=1, text=control.encode(record()), directory=directory))
    assert decision.exit_code == exitcodes.RECORD_REFUSED
    assert "writable" in decision.message


def test_a_control_dir_of_another_user_is_refused():
    directory = gate.DirSeen(mode=0o40700, owner=0, is_dir=True)
    _, decision = decide(seen(directory=directory))
    assert decision.exit_code == exitcodes.RECORD_REFUSED


def test_a_stale_lease_means_task_0_died_without_its_trap_and_must_be_fenced():
    _, decision = decide(seen(lease_age=61, text=control.encode(record())))
    assert decision.exit_code == exitcodes.TASK0_GONE and decision.fence
    assert "not been refreshed for 61.0 s" in decision.message
    assert decision.over  # and the first peer to leave relays the end


def test_a_closed_flag_is_left_on_without_fencing():
    _, decision = decide(seen(closed=True, lease_age=61))
    assert decision.exit_code == exitcodes.TASK0_GONE and not decision.fence


def test_a_node_on_task_0s_old_host_refuses_to_host_the_rendezvous():
    # Slurm placed this (cold spare) task on task 0's node: task 0 is gone.
    on_task0s_node = peer(names=("node1", "node1.cluster", "10.0.0.1"))
    _, decision = decide(seen(lease_age=1, text=control.encode(record())), who=on_task0s_node)
    assert decision.exit_code == exitcodes.TASK0_GONE
    assert "refusing to host the rendezvous" in decision.message


def test_a_fully_qualified_record_host_still_matches_this_node():
    on_task0s_node = peer(names=("node1",))
    text = control.encode(record(host="node1.cluster.example"))
    _, decision = decide(seen(lease_age=1, text=text), who=on_task0s_node)
    assert decision.exit_code == exitcodes.TASK0_GONE


def test_a_peer_without_cluster_uuid_refuses_task_0s_segment_mode_naming_both_nodes():
    text = control.encode(record(segment=1, cluster_uuid=GB200.cluster_uuid))
    _, decision = decide(seen(lease_age=1, text=text), who=peer(fabric=NO_FABRIC))
    assert decision.exit_code == exitcodes.SEGMENT_MISMATCH
    assert "task 0 on node1" in decision.message
    assert "task 1 node 0 (node2)" in decision.message


def test_a_peer_with_cluster_uuid_joins_segment_mode():
    text = control.encode(record(segment=1, cluster_uuid=GB200.cluster_uuid))
    _, decision = decide(seen(lease_age=1, text=text), who=peer(fabric=GB200))
    assert isinstance(decision, gate.Join)
    assert decision.record.segment == 1


# --- while ft_launcher runs ------------------------------------------------------------


def test_a_running_node_stops_when_the_flag_appears():
    verdict = gate.while_running(closed=True, lease_age=1, watch_lease=True, stale_after=60)
    assert verdict.exit_code == exitcodes.STOPPED_BY_CLOSED_FLAG


def test_a_running_peer_stops_when_task_0s_lease_goes_stale():
    verdict = gate.while_running(closed=False, lease_age=90, watch_lease=True, stale_after=60)
    assert verdict.exit_code == exitcodes.TASK0_GONE
    assert gate.while_running(closed=False, lease_age=5, watch_lease=True, stale_after=60) is None


def test_task_0_does_not_judge_its_own_lease():
    assert (
        gate.while_running(closed=False, lease_age=None, watch_lease=False, stale_after=60) is None
    )


# --- the same states, read from a real directory -----------------------------------------


def _generation_dir(tmp_path, array_job_id):
    directory = tmp_path / "nvrx" / array_job_id / "control"
    controldir.prepare(directory, os.geteuid())
    return directory


OURS = control.generation(support.CHAIN, "4242", "2026-01-01T00:00:00")


def _observe(directory, generation=OURS):
    return controldir.observe(directory, controldir.LeaseWatch(directory, generation), generation)


def _me():
    node = Node(array_job_id="4242", task_id=1, node_id=0, job_id="4244", hostname="node2")
    return gate.Peer(node=node, uid=os.geteuid(), own_names=frozenset({"node2"}), fabric=NO_FABRIC)


def _publish(directory, rec):
    keeper = controldir.LeaseKeeper(directory, interval=60, holder={"host": rec.host}, warn=print)
    keeper.start()
    keeper.stop()
    controldir.publish(directory, rec)


def test_a_stale_flag_of_the_previous_generation_does_not_stop_the_new_one(tmp_path):
    previous = _generation_dir(tmp_path, "4100")
    ControlFiles(previous).closed.write_text('{"exit_code": 1}\n')
    current = _generation_dir(tmp_path, "4242")
    _publish(current, record())
    _, decision = gate.step(gate.Waiting(), _observe(current), 0.0, _me(), LIMITS)
    assert decision == gate.Join(record())


def test_a_world_writable_control_dir_on_disk_is_refused(tmp_path):
    directory = _generation_dir(tmp_path, "4242")
    _publish(directory, record())
    directory.chmod(0o777)
    with pytest.raises(controldir.ControlDirError, match="writable"):
        controldir.prepare(directory, os.geteuid())
    _, decision = gate.step(gate.Waiting(), _observe(directory), 0.0, _me(), LIMITS)
    assert decision.exit_code == exitcodes.RECORD_REFUSED


def test_a_symlink_in_place_of_the_record_is_refused(tmp_path):
    directory = _generation_dir(tmp_path, "4242")
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(control.encode(record(host="evil")))
    _publish(directory, record())
    ControlFiles(directory).record.unlink()
    ControlFiles(directory).record.symlink_to(elsewhere)
    _, decision = gate.step(gate.Waiting(), _observe(directory), 0.0, _me(), LIMITS)
    assert decision.exit_code == exitcodes.RECORD_REFUSED


def test_a_running_peer_that_finds_the_lease_stale_fences_and_one_that_sees_the_flag_does_not():
    stale = gate.while_running(closed=False, lease_age=61, watch_lease=True, stale_after=60)
    assert stale.exit_code == exitcodes.TASK0_GONE and stale.fence
    flagged = gate.while_running(closed=True, lease_age=61, watch_lease=True, stale_after=60)
    assert flagged.exit_code == exitcodes.STOPPED_BY_CLOSED_FLAG and not flagged.fence
    # Either way the generation is over, and the first peer to leave relays it.
    assert stale.over and flagged.over


def test_a_peers_exit_93_is_never_relayed_so_every_launcher_can_leave_its_witness():
    text = control.encode(record())
    observed = gate.Observation(
        directory=OK_DIR, closed=False, lease_age=1, record=gate.FileSeen(text, UID, True),
        no_restart=True,
    )  # fmt: skip
    _, decision = decide(observed)
    assert decision.exit_code == exitcodes.TASK0_GONE and not decision.over


def test_task_0_stops_itself_once_its_lease_has_gone_unrefreshed_past_the_deadline():
    assert gate.self_fence(unrefreshed_for=4.9, deadline=5) is None
    stop = gate.self_fence(unrefreshed_for=5.0, deadline=5)
    assert stop.exit_code == exitcodes.SELF_FENCED and not stop.fence
    assert "stopping ft_launcher" in stop.message


# --- files of another run under a reused array job id (issue 15.3) ----------------------


def test_another_runs_flag_lease_and_record_under_a_reused_job_id_are_not_seen(tmp_path):
    directory = _generation_dir(tmp_path, "4242")
    other = control.generation("2025-06-01T00:00:00Z", "4242", "2025-06-01T00:00:00")
    _publish(directory, record(host="oldhost", generation=other))
    ControlFiles(directory).lease.write_text(json.dumps({"generation": other}) + "\n")
    old = os.stat(ControlFiles(directory).lease).st_mtime - 600
    os.utime(ControlFiles(directory).lease, (old, old))
    ControlFiles(directory).closed.write_text(control.encode_fields({"generation": other}))

    observed = _observe(directory)
    assert (observed.closed, observed.lease_age, observed.record) == (False, None, None)
    # So a peer that starts before the new task 0 waits for it, without a timeout.
    _, decision = gate.step(gate.Waiting(), observed, 0.0, _me(), LIMITS)
    assert isinstance(decision, gate.Wait) and "not started yet" in decision.reason
    # The same files of this generation would have sent it away.
    assert _observe(directory, other).closed


def test_the_same_array_job_submitted_again_is_another_generation():
    ours = control.generation("c1", "4242", "2026-01-01T00:00:00")
    assert control.same_generation(ours, ours)
    assert not control.same_generation(
        control.generation("c1", "4242", "2026-02-01T00:00:00"), ours
    )
    assert not control.same_generation(
        control.generation("c2", "4242", "2026-01-01T00:00:00"), ours
    )
    # A node whose scontrol failed knows no submit time: chain and array job decide.
    assert control.same_generation(control.generation("c1", "4242"), ours)
    assert not control.same_generation("garbage", ours)


def test_only_one_of_many_racing_peers_wins_the_fence_claim(tmp_path):
    directory = _generation_dir(tmp_path, "4242")
    with multiprocessing.get_context("fork").Pool(8) as pool:
        won = pool.starmap(
            controldir.claim_fence, [(directory, {"job_id": str(n)}) for n in range(32)]
        )
    assert won.count(True) == 1
    claim = json.loads(ControlFiles(directory).fence.read_text())
    assert claim["job_id"] == str(won.index(True))


def test_a_peers_exit_93_sends_a_late_spare_away_before_it_joins(tmp_path):
    # The hot spare's ft_launcher exited 93 and the scheduler admitted a cold spare in its
    # place while task 0's launcher still drains: the spare must not join that rendezvous.
    directory = _generation_dir(tmp_path, "4242")
    _publish(directory, record())
    controldir.mark_no_restart(directory, exitcodes.NVRX_NO_RESTART, OURS)
    _, decision = gate.step(gate.Waiting(), _observe(directory), 0.0, _me(), LIMITS)
    assert isinstance(decision, gate.Leave) and not decision.fence
    assert decision.exit_code == exitcodes.TASK0_GONE != exitcodes.NVRX_NO_RESTART
    assert "exited 93" in decision.message
    # Bound to its generation: the same file of another run is not a witness.
    other = control.generation(support.CHAIN, "4242", "2026-02-02T00:00:00")
    _, decision = gate.step(gate.Waiting(), _observe(directory, other), 0.0, _me(), LIMITS)
    assert not isinstance(decision, gate.Leave)


@pytest.mark.parametrize(
    "text",
    ["{}\n", '{"exit_code": 1}\n', "\n", '{"generation": 7}\n', "exit_code=1\n", "generation=\n"],
)
def test_a_closed_flag_or_witness_that_names_no_generation_ends_nothing(tmp_path, text):
    # Left under a reused array job id by another run (or an older tool), it would end a
    # healthy new generation: only a file that names this generation is obeyed.
    directory = _generation_dir(tmp_path, "4242")
    _publish(directory, record())
    ControlFiles(directory).closed.write_text(text)
    ControlFiles(directory).no_restart.write_text(text)
    observed = _observe(directory)
    assert (observed.closed, observed.no_restart) == (False, False)
    _, decision = gate.step(gate.Waiting(), observed, 0.0, _me(), LIMITS)
    assert decision == gate.Join(record())
    ControlFiles(directory).closed.write_text(f"generation={record().generation}\nexit_code=1\n")
    assert _observe(directory).closed
