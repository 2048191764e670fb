"""Node liveness on the wire: every node beats, task 0 listens, judges and acts.

Task 0's entrypoint binds a UDP socket before it publishes its rendezvous record, and
the record carries the socket's port and a key drawn for the generation
(liveness_rule.py says why a key). Every other node's entrypoint, once it has joined,
sends task 0 a beat each beat period from a thread that touches no file system, so a
stalled shared file system or a busy node's ranks cannot hold it up.

Task 0's listener thread reads the beats and looks at the roll every LOOK_S. A node that
went silent past the bound is probed first: a datagram to the port its beats came from.
A live kernel answers a closed port with "port unreachable" (the node lives, only its
entrypoint is gone: no node death). Silence again: the node is dead, and `on_dead` is
called once for it (node/dead_node.py decides what that means for the cycle). A node
judged dead that beats again is answered "out", each time it beats, and its own
beater calls `on_out` once: its entrypoint stops ft_launcher and leaves.

Nothing here blocks the entrypoint: both ends are daemon threads, and a failure of the
network stack only costs the detection (said once in the log), never the run.
"""

from __future__ import annotations

import contextlib
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable

from nvrx_appliance.node import liveness_rule as rule

Log = Callable[[str], None]
# Room for a few seconds of beats at 10,000 nodes while this process does something
# else (a datagram that finds the buffer full is dropped; its node beats again anyway).
RECEIVE_BUFFER_BYTES = 8 << 20


def new_key() -> bytes:
    return secrets.token_bytes(rule.KEY_BYTES)


def _bound_socket() -> socket.socket:
    """A UDP socket on every address of this host, IPv6 and IPv4 at once where the host
    allows it, else IPv4 alone."""
    with contextlib.suppress(OSError):
        sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::", 0))
            return sock
        except OSError:
            sock.close()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", 0))
    return sock


def probe_refused(addresses: list[tuple], family: int, wait: float = rule.PROBE_WAIT_S) -> set[int]:
    """Which of the hosts at `addresses` refuse a datagram to that port (their indexes),
    all probed at once, waiting `wait` at most: a connected UDP socket reports the
    kernel's ICMP "port unreachable" as a refused connection. A host that is gone, or
    whose link is, says nothing; one whose port still has a reader (a frozen process's
    socket) neither."""
    socks: dict[socket.socket, int] = {}
    for index, address in enumerate(addresses):
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            sock.connect(address)
            sock.send(b"probe")
            socks[sock] = index
        except OSError:  # no route at all: nothing will answer either
            sock.close()
    refused: set[int] = set()
    deadline = time.monotonic() + wait
    try:
        while socks and (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select(list(socks), [], [], left)
            if not readable:
                break
            for sock in readable:
                try:
                    sock.recv(64)
                except ConnectionRefusedError:
                    refused.add(socks[sock])
                except OSError:
                    pass
                sock.close()
                del socks[sock]
    finally:
        for sock in socks:
            sock.close()
    return refused


class Listener:
    """Task 0's end. `port` is known once constructed (publish it); start() begins."""

    def __init__(
        self,
        generation: str,
        key: bytes,
        *,
        timeout: float,
        nodes: int,
        on_dead: Callable[[rule.Silent], None],
        log: Log,
        probe: Callable[[list[tuple], int], set[int]] = probe_refused,
    ):
        self.generation = generation
        self.key = key
        self.on_dead = on_dead
        self.log = log
        self.probe = probe
        self.roll = rule.Roll(rule.silence_bound(timeout, nodes), rule.beat_period(nodes))
        self.addresses: dict[str, tuple] = {}  # node -> where its beats come from
        self.sock = _bound_socket()
        self.sock.setblocking(False)
        with contextlib.suppress(OSError):  # the kernel caps it at net.core.rmem_max
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
        self.port = int(self.sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="liveness-listener", daemon=True)
        self._blind_said = ""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * rule.LOOK_S + rule.PROBE_WAIT_S)
        self.sock.close()

    def _run(self) -> None:
        next_look = time.monotonic() + rule.LOOK_S
        while not self._stop.is_set():
            wait = max(0.0, next_look - time.monotonic())
            try:
                readable, _, _ = select.select([self.sock], [], [], wait)
                if readable:
                    self._drain()
            except OSError as exc:
                self.log(f"liveness: the beat socket failed ({exc}); no silent node is "
                         "detected for the rest of this generation")  # fmt: skip
                return
            now = time.monotonic()
            if now >= next_look:
                next_look = now + rule.LOOK_S
                self._look(now)

    def _drain(self) -> None:
        """Every datagram waiting now, heard at one instant: the roll's time is when
        task 0 reads them, which is what its own look compares against."""
        now = time.monotonic()
        while True:
            try:
                data, address = self.sock.recvfrom(rule.DATAGRAM_BYTES + 1)
            except (BlockingIOError, InterruptedError):
                return
            message = rule.decode(self.key, self.generation, data)
            if message is not None and message.kind == rule.BYE:
                self.roll.leave(message.node)
            if message is None or message.kind != rule.BEAT:
                continue
            self.addresses[message.node] = address
            if self.roll.hear(message.node, now, message.task):
                reply = rule.encode(
                    self.key, rule.OUT, self.generation, message.node, message.task, message.seq
                )
                with contextlib.suppress(OSError):
                    self.sock.sendto(reply, address)

    def _look(self, now: float) -> None:
        silent = self.roll.look(now)
        heard = [s for s in silent if s.node in self.addresses]
        refused = self.probe([self.addresses[s.node] for s in heard], self.sock.family)
        lives = {heard[i].node for i in refused}
        for found in silent:
            if found.node in lives:
                self.roll.refused(found.node)
                self.log(f"liveness: {found.node} has sent no beat for {found.silent_s:.0f} s "
                         "but its host refuses a probe: the node lives and its entrypoint is "
                         "gone; no node death")  # fmt: skip
                continue
            self.roll.judged(found.node)
            try:
                self.on_dead(found)
            except Exception as exc:  # the judgement stands; the listener must go on
                self.log(f"liveness: acting on {found.node}'s death failed: {exc!r}")
        if self.roll.blind and self.roll.blind != self._blind_said:
            self.log(f"liveness: {self.roll.blind}")
        self._blind_said = self.roll.blind


class Beater:
    """Every other node's end: a beat to task 0 each period, and `on_out` once if task 0
    answers that it judged this node dead."""

    def __init__(
        self,
        host: str,
        port: int,
        generation: str,
        key: bytes,
        node: str,
        *,
        task: int,
        nodes: int,
        on_out: Callable[[], None],
        log: Log,
    ):
        self.target = (host, port)
        self.generation = generation
        self.key = key
        self.node = node
        self.task = task
        self.period = rule.beat_period(nodes)
        self.on_out = on_out
        self.log = log
        self.out = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="liveness-beater", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self.period)

    def _open(self) -> tuple[socket.socket, tuple] | None:
        """A socket for the beats and task 0's address. Not connected: a connected UDP
        socket takes datagrams from its peer's address alone, and its kernel would
        refuse task 0's probe, which comes from another port, as if nobody were here."""
        for family in (socket.AF_INET, socket.AF_UNSPEC):  # IPv4 where task 0 has it
            try:
                family, kind, proto, _, address = socket.getaddrinfo(
                    *self.target, family=family, type=socket.SOCK_DGRAM
                )[0]
                return socket.socket(family, kind, proto), address
            except OSError:
                continue
        return None

    def _run(self) -> None:
        opened: tuple[socket.socket, tuple] | None = None
        seq = 0
        said = False
        try:
            while not self._stop.is_set():
                opened = opened or self._open()
                if opened is None:
                    if not said:
                        self.log(f"liveness: cannot reach task 0 at {self.target[0]} yet; "
                                 "still trying")  # fmt: skip
                        said = True
                    self._stop.wait(self.period)
                    continue
                sock, task0 = opened
                seq += 1
                with contextlib.suppress(OSError):  # a link down now is a silence, no more
                    sock.sendto(self._datagram(rule.BEAT, seq), task0)
                self._listen(sock, time.monotonic() + self.period)
        finally:
            if opened is not None:
                sock, task0 = opened
                if not self.out.is_set():  # its silence from now on is no death
                    with contextlib.suppress(OSError):
                        sock.sendto(self._datagram(rule.BYE, seq + 1), task0)
                sock.close()

    def _datagram(self, kind: str, seq: int) -> bytes:
        return rule.encode(self.key, kind, self.generation, self.node, self.task, seq)

    def _listen(self, sock: socket.socket, until: float) -> None:
        while not self._stop.is_set():
            wait = until - time.monotonic()
            if wait <= 0:
                return
            try:
                readable, _, _ = select.select([sock], [], [], wait)
                if not readable:
                    return
                data = sock.recv(rule.DATAGRAM_BYTES + 1)
            except OSError:  # a link down: wait out the period, beat again
                self._stop.wait(max(0.0, until - time.monotonic()))
                return
            message = rule.decode(self.key, self.generation, data)
            told = message is not None and message.kind == rule.OUT and message.node == self.node
            if told and not self.out.is_set():
                self.out.set()
                self.on_out()
