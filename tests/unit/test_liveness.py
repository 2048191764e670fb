"""Node liveness (issue 52): task 0 takes a node that stopped beating for dead within the
silence timeout, and never a node that is slow, left on its own, cut off together with
task 0's own link, or whose host still answers. The judgement is pure (a Roll fed
times); the wire runs on real UDP sockets on this host."""

from __future__ import annotations

import socket
import threading

import pytest

from nvrx_appliance.node import liveness
from nvrx_appliance.node import liveness_rule as rule

KEY = bytes(range(32))
GEN = "2026-01-01T00:00:00Z/4242/2026-01-01T00:00:01"
BOUND, PERIOD = 10.0, 1.0


def _roll() -> rule.Roll:
    return rule.Roll(bound=BOUND, period=PERIOD)


def _run(roll: rule.Roll, start: float, end: float, beating=("node2", "node3")):
    """Task 0 looks every LOOK_S from `start` to `end` while the nodes in `beating` beat
    once a period; what each look named, as (time, node)."""
    named, t = [], start
    while t <= end + 1e-9:
        if round(t / PERIOD, 6).is_integer():
            for node in beating:
                roll.hear(node, t)
        named += [(t, s.node) for s in roll.look(t)]
        t = round(t + rule.LOOK_S, 6)
    return named


# --- the wire -------------------------------------------------------------------------


def test_a_beat_reads_back_only_with_its_key_and_generation():
    data = rule.encode(KEY, rule.BEAT, GEN, "node2", 1, 7)
    assert rule.decode(KEY, GEN, data) == rule.Message(rule.BEAT, "node2", 1, 7)
    assert rule.decode(bytes(32), GEN, data) is None  # another key: a forged beat
    assert rule.decode(KEY, GEN.replace("4242", "4243"), data) is None  # another generation
    tampered = data.replace(b"node2", b"node3")
    assert rule.decode(KEY, GEN, tampered) is None
    assert rule.decode(KEY, GEN, b"\xff" * 10) is None
    assert rule.decode(KEY, GEN, b"x" * (rule.DATAGRAM_BYTES + 1)) is None
    assert rule.decode(KEY, GEN, b"beat|" + GEN.encode() + b"|node2|1") is None  # no mac


def test_an_out_for_a_node_cannot_be_forged_without_the_key():
    forged = rule.encode(b"k" * 32, rule.OUT, GEN, "node2", 1, 1)
    assert rule.decode(KEY, GEN, forged) is None
    real = rule.encode(KEY, rule.OUT, GEN, "node2", 1, 1)
    assert rule.decode(KEY, GEN, real) == rule.Message(rule.OUT, "node2", 1, 1)


# --- the judgement ----------------------------------------------------------------------


def test_a_node_silent_past_the_bound_is_named_and_not_before():
    roll = _roll()
    assert _run(roll, 0.0, 20.0) == []
    # node3 dies just after its beat at 20.0; node2 goes on beating.
    assert _run(roll, 20.5, 30.0, beating=("node2",)) == []
    assert _run(roll, 30.5, 30.5, beating=("node2",)) == [(30.5, "node3")]


def test_a_five_second_blip_names_nobody():
    roll = _roll()
    _run(roll, 0.0, 20.0)
    _run(roll, 20.5, 25.0, beating=("node2",))  # node3's link down: its beats lost
    assert _run(roll, 25.5, 60.0) == []


def test_a_judge_that_was_itself_stopped_gives_every_node_a_fresh_timeout():
    """Task 0's node frozen for 30 s: when it runs again every beat is old, and none of
    that silence is the nodes' doing."""
    roll = _roll()
    _run(roll, 0.0, 20.0)
    assert roll.look(50.0) == []  # the first look after the gap: nobody named
    # node3 beat nothing since 20.0; from the thaw on its silence counts afresh.
    assert _run(roll, 50.5, 60.0, beating=("node2",)) == []
    assert _run(roll, 60.5, 60.5, beating=("node2",)) == [(60.5, "node3")]


def test_when_every_node_falls_silent_it_is_task_0s_own_link_and_nobody_is_named():
    roll = _roll()
    _run(roll, 0.0, 20.0)
    assert _run(roll, 20.5, 60.0, beating=()) == []
    assert "its own link, not theirs; nobody is named" in roll.blind
    assert "node2, node3 silent" in roll.blind


def test_a_node_judged_dead_is_answered_out_and_never_judged_again():
    roll = _roll()
    _run(roll, 0.0, 20.0)
    [(_, node)] = _run(roll, 20.5, 30.5, beating=("node2",))
    roll.judged(node)
    assert roll.hear("node3", 31.0) is True  # it came back: it must leave
    assert roll.hear("node2", 31.0) is False
    assert _run(roll, 31.5, 60.0, beating=("node2",)) == []  # silent again: not twice


def test_a_node_whose_host_refused_is_spared_until_it_beats_and_falls_silent_again():
    roll = _roll()
    _run(roll, 0.0, 20.0)
    [(_, node)] = _run(roll, 20.5, 30.5, beating=("node2",))
    roll.refused(node)
    assert _run(roll, 31.5, 40.0, beating=("node2",)) == []
    _run(roll, 40.5, 41.0)  # it beats again, then is gone for good
    assert _run(roll, 41.5, 51.5, beating=("node2",)) == [(51.5, "node3")]


def test_a_node_that_said_goodbye_is_no_death():
    roll = _roll()
    _run(roll, 0.0, 20.0)
    roll.leave("node3")
    assert _run(roll, 20.5, 60.0, beating=("node2",)) == []


def test_beats_slow_down_past_ten_thousand_nodes_and_the_bound_follows():
    assert rule.beat_period(4) == 1.0
    assert rule.beat_period(10_000) == 1.0
    assert rule.beat_period(20_000) == 2.0
    assert rule.silence_bound(10, 10_000) == 10.0
    assert rule.silence_bound(10, 50_000) == 15.0  # three beats of 5 s
    # The documented bound at the defaults: silence + a beat + a look + the probe.
    assert rule.detection_bound(10, 1000) == pytest.approx(12.5)


# --- on real sockets ----------------------------------------------------------------------


class _Seen:
    def __init__(self) -> None:
        self.dead: list[rule.Silent] = []
        self.event = threading.Event()
        self.lines: list[str] = []

    def on_dead(self, silent: rule.Silent) -> None:
        self.dead.append(silent)
        self.event.set()


def _listener(seen: _Seen, bound: float = 0.6) -> liveness.Listener:
    found = liveness.Listener(
        GEN, KEY, timeout=10, nodes=3, on_dead=seen.on_dead, log=seen.lines.append
    )
    # The same judge, at a scale a unit test can wait for.
    found.roll = rule.Roll(bound=bound, period=0.1)
    found.start()
    return found


class _Node:
    """A node's beats from a socket the test drives: it can fall silent while its socket
    stays open (frozen, or its link gone), or close it (its entrypoint gone)."""

    def __init__(self, name: str, port: int):
        self.name = name
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.task0 = ("127.0.0.1", port)
        self.seq = 0

    def beat(self) -> None:
        self.seq += 1
        self.sock.sendto(rule.encode(KEY, rule.BEAT, GEN, self.name, 2, self.seq), self.task0)


def _keep_beating(node: _Node, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        while not stop.wait(0.05):
            node.beat()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_frozen_node_is_taken_for_dead_and_told_out_when_it_comes_back():
    seen = _Seen()
    listener = _listener(seen)
    alive, frozen = _Node("node2", listener.port), _Node("node3", listener.port)
    stop = threading.Event()
    try:
        frozen.beat()
        _keep_beating(alive, stop)
        # node3's socket stays open and says nothing: no refusal comes back to the probe.
        assert seen.event.wait(10), f"no verdict: {seen.lines}"
        assert [s.node for s in seen.dead] == ["node3"]
        frozen.sock.settimeout(5)
        frozen.beat()  # thawed: what waits in its socket is task 0's probe, then "out"
        replies = [frozen.sock.recv(rule.DATAGRAM_BYTES) for _ in range(2)]
        assert replies[0] == b"probe"
        assert rule.decode(KEY, GEN, replies[1]) == rule.Message(rule.OUT, "node3", 2, frozen.seq)
    finally:
        stop.set()
        listener.stop()
        alive.sock.close()
        frozen.sock.close()
    assert [s.node for s in seen.dead] == ["node3"]


def test_a_node_whose_entrypoint_ended_but_whose_host_answers_is_no_death():
    seen = _Seen()
    listener = _listener(seen)
    alive, gone = _Node("node2", listener.port), _Node("node3", listener.port)
    stop = threading.Event()
    try:
        gone.beat()
        gone.sock.close()  # this host's kernel now refuses datagrams to that port
        _keep_beating(alive, stop)
        assert _wait_for(lambda: "node3" in listener.roll.spared, 10), seen.lines
    finally:
        stop.set()
        listener.stop()
        alive.sock.close()
    assert seen.dead == []
    assert any("refuses a probe: the node lives" in line for line in seen.lines)


def _wait_for(condition, timeout: float) -> bool:
    done = threading.Event()
    deadline = threading.Timer(timeout, done.set)
    deadline.start()
    try:
        while not done.wait(0.05):
            if condition():
                return True
        return condition()
    finally:
        deadline.cancel()


def test_a_beater_that_stops_on_its_own_says_goodbye_and_is_no_death():
    seen = _Seen()
    listener = _listener(seen, bound=2.5)  # a Beater beats once a second
    out = threading.Event()
    beater = liveness.Beater(
        "127.0.0.1",
        listener.port,
        GEN,
        KEY,
        "node3",
        task=2,
        nodes=3,
        on_out=out.set,
        log=seen.lines.append,
    )
    alive = _Node("node2", listener.port)
    stop = threading.Event()
    try:
        beater.start()
        _keep_beating(alive, stop)
        assert _wait_for(lambda: "node3" in listener.roll.heard, 5)
        beater.stop()
        assert _wait_for(lambda: "node3" not in listener.roll.heard, 5)
    finally:
        stop.set()
        listener.stop()
        alive.sock.close()
    assert seen.dead == [] and not out.is_set()


def test_a_beater_told_out_calls_its_node_away_once_and_ignores_a_forged_out():
    told = []
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.settimeout(5)
    beater = liveness.Beater(
        "127.0.0.1", server.getsockname()[1], GEN, KEY, "node3", task=2, nodes=3,
        on_out=lambda: told.append(1), log=lambda line: None,
    )  # fmt: skip
    try:
        beater.start()
        data, address = server.recvfrom(rule.DATAGRAM_BYTES)
        assert rule.decode(KEY, GEN, data).kind == rule.BEAT
        server.sendto(rule.encode(b"x" * 32, rule.OUT, GEN, "node3", 2, 1), address)
        server.sendto(rule.encode(KEY, rule.OUT, GEN, "node2", 1, 1), address)  # not this node
        server.recvfrom(rule.DATAGRAM_BYTES)  # the next beat: both were read by then
        assert not beater.out.is_set()
        for _ in range(2):
            server.sendto(rule.encode(KEY, rule.OUT, GEN, "node3", 2, 1), address)
        assert beater.out.wait(5)
        server.recvfrom(rule.DATAGRAM_BYTES)
        server.recvfrom(rule.DATAGRAM_BYTES)
    finally:
        beater.stop()
        server.close()
    assert told == [1]


def test_silent_nodes_are_probed_together_and_only_a_refusing_host_is_spared():
    frozen = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    frozen.bind(("127.0.0.1", 0))  # a reader that never reads: a frozen node's socket
    gone = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    gone.bind(("127.0.0.1", 0))
    closed = gone.getsockname()
    gone.close()  # nothing reads this port any more: the kernel refuses
    try:
        addresses = [frozen.getsockname(), closed, frozen.getsockname()]
        assert liveness.probe_refused(addresses, socket.AF_INET, wait=2.0) == {1}
    finally:
        frozen.close()
