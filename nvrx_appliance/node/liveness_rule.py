"""Node liveness: when a node that stopped beating is dead, and the beats' wire format.
Pure: every function takes the time it judges at.

A node that dies silently (a power loss, a kernel panic, a dead NIC) sends nothing: its
peers' collectives wait on it until a timeout of theirs, NVRx's section timeouts (180 s
in a step, 600 s in a save or between sections at the defaults), gloo's 30 minutes or
NCCL's 10, and Slurm marks it down only after SlurmdTimeout (300 s by default). So
every node's entrypoint sends task 0 a small UDP datagram, a beat, once a beat period,
and task 0's entrypoint judges who went silent (node/liveness.py runs both ends). Beats
cross the network, never the shared file system: task 0 hears N beats a period and
nobody reads anything on storage for them.

A node is dead when all of these hold (Roll.look):

- task 0 has heard nothing from it for the silence timeout (`--node-silence-timeout`,
  10 s by default: twice a 5 s network blip) counted only while task 0 itself was
  listening: a judge that was stopped or starved for a while gives every node a fresh
  timeout when it runs again, since beats it slept through prove nothing;
- task 0 still hears some other node: when every node falls silent at once it is task
  0's own link that failed, not theirs, and nobody is named;
- the node's host does not refuse a probe (node/liveness.py): a host whose kernel
  answers "port unreachable" lives, only its entrypoint is gone (its ft_launcher went
  with it, and NVRx saw that as a crash); that is no node death.

A node whose entrypoint ends on its own says goodbye first and is struck off the roll:
a generation that ends, or a node that leaves it (drained, told to leave), is no death.

A node judged dead stays dead for the rest of the generation: if it beats again (a
link that came back, a frozen node thawed) task 0 answers "out" and it leaves, and it
is never judged or counted a second time.

The wire format: one line of ASCII fields joined by `|`, the last an HMAC-SHA256 (128
bits, hex) over the rest with the generation's key, which task 0 draws at random and
publishes in its rendezvous record (owner-only, like the control directory it lives
in). A datagram that does not verify is dropped: another user on the network can
neither keep a dead node alive nor send a live one away.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field

BEAT_S = 1.0  # a beat per node per second, up to MAX_BEATS_PER_S at task 0
MAX_BEATS_PER_S = 10_000  # what task 0 hears at most: beats slow down past this many nodes
# Beats a node may miss before its silence counts for anything: at least three periods
# of silence, whatever timeout was asked for (a dropped datagram or two is weather).
MIN_PERIODS = 3
# Task 0 looks this often; a look that comes much later than this (HELD_S) means task 0
# itself was stopped or starved, and silences seen across it are not the nodes' doing.
LOOK_S = 0.5
HELD_S = 4 * LOOK_S
# A node counts as heard "now" (task 0's own link works) within this many periods.
RECENT_PERIODS = 3
DATAGRAM_BYTES = 1024  # a beat is about 100 bytes; anything larger is not ours
KEY_BYTES = 32
MAC_HEX = 32  # 128 bits of HMAC-SHA256

BEAT = "beat"
BYE = "bye"  # a node's entrypoint is ending on its own: its silence from now is no death
OUT = "out"


def beat_period(nodes: int) -> float:
    """Seconds between a node's beats in a generation of `nodes` nodes: one a second,
    slower past MAX_BEATS_PER_S nodes, so task 0 never hears more than that a second."""
    return max(BEAT_S, nodes / MAX_BEATS_PER_S)


def silence_bound(timeout: float, nodes: int) -> float:
    """The silence after which a node is dead: the chain's timeout, or MIN_PERIODS beat
    periods where the beats are slower than that allows."""
    return max(float(timeout), MIN_PERIODS * beat_period(nodes))


def detection_bound(timeout: float, nodes: int) -> float:
    """From a death to task 0's verdict, at the latest: the last beat may have left a
    beat period before the death, the silence runs out, the next look comes, and the
    probe waits for a refusal that does not come."""
    return silence_bound(timeout, nodes) + beat_period(nodes) + LOOK_S + PROBE_WAIT_S


PROBE_WAIT_S = 1.0  # how long task 0 waits for a silent node's host to refuse a probe


# --- the wire format --------------------------------------------------------------------


def _mac(key: bytes, body: str) -> str:
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()[:MAC_HEX]


def encode(key: bytes, kind: str, generation: str, node: str, task: int, seq: int) -> bytes:
    body = "|".join((kind, generation, node, str(task), str(seq)))
    return f"{body}|{_mac(key, body)}".encode()


@dataclass(frozen=True)
class Message:
    kind: str  # BEAT, BYE (a node to task 0) or OUT (task 0 to a node it judged dead)
    node: str  # the node that beats, or the one sent away
    task: int  # its array task
    seq: int


def decode(key: bytes, generation: str, data: bytes) -> Message | None:
    """The message in a datagram, or None for anything that is not one of ours, of
    another generation, or does not verify."""
    if len(data) > DATAGRAM_BYTES:
        return None
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        return None
    body, sep, mac = text.rpartition("|")
    fields = body.split("|")
    if not sep or len(fields) != 5 or not hmac.compare_digest(mac, _mac(key, body)):
        return None
    kind, theirs, node, task, seq = fields
    if kind not in (BEAT, BYE, OUT) or theirs != generation or not node:
        return None
    if not (task.isdecimal() and seq.isdecimal()):
        return None
    return Message(kind, node, int(task), int(seq))


# --- the judgement ----------------------------------------------------------------------


@dataclass(frozen=True)
class Silent:
    """A node task 0 has stopped hearing, past the bound."""

    node: str
    last_heard: float  # task 0's monotonic clock at its last beat
    silent_s: float
    task: int = -1  # its array task, as its beats said


@dataclass
class Roll:
    """What task 0 has heard, by node, and whom it judged dead. Times are task 0's
    monotonic clock; the caller passes them in."""

    bound: float  # silence_bound()
    period: float  # beat_period()
    heard: dict[str, float] = field(default_factory=dict)  # node -> last beat
    tasks: dict[str, int] = field(default_factory=dict)  # node -> its array task
    dead: set[str] = field(default_factory=set)
    spared: set[str] = field(default_factory=set)  # silent, but their host refused a probe
    last_look: float | None = None
    blind: str = ""  # why the last look named nobody though some were silent, for the log

    def hear(self, node: str, now: float, task: int = -1) -> bool:
        """A beat from `node` (of array task `task`); True when that node was judged dead
        (it must leave)."""
        self.heard[node] = now
        self.tasks[node] = task
        self.spared.discard(node)  # it beats again: a later silence is judged afresh
        return node in self.dead

    def leave(self, node: str) -> None:
        """The node said goodbye: its entrypoint ends on its own, and its silence from
        now on says nothing. A node judged dead stays so."""
        self.heard.pop(node, None)

    def look(self, now: float) -> list[Silent]:
        """The nodes silent past the bound, not judged before, to be probed and judged
        (then `judged` or `refused`). None while task 0 itself was held, or hears no
        node at all."""
        held = self.last_look is not None and now - self.last_look > HELD_S
        if held:
            # Beats that came while we were stopped wait in the socket or were dropped;
            # either way a silence across our own gap is not evidence against anyone.
            self.heard = {node: max(at, now) for node, at in self.heard.items()}
        self.last_look = now
        silent = [
            Silent(node, at, now - at, self.tasks.get(node, -1))
            for node, at in sorted(self.heard.items())
            if now - at > self.bound and node not in self.dead and node not in self.spared
        ]
        if not silent:
            self.blind = ""
            return []
        recent = RECENT_PERIODS * self.period
        if not any(now - at <= recent for node, at in self.heard.items() if node not in self.dead):
            self.blind = (
                f"task 0 hears no node at all ({', '.join(s.node for s in silent)} silent "
                f"past {self.bound:g} s): its own link, not theirs; nobody is named"
            )
            return []
        self.blind = ""
        return silent

    def judged(self, node: str) -> None:
        self.dead.add(node)

    def refused(self, node: str) -> None:
        """The node's host refused the probe: it lives. Not judged again until it has
        beaten once more and fallen silent again."""
        self.spared.add(node)
