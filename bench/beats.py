"""16. Liveness beats at scale (issue 52): what task 0's listener costs when every node of
a 1,000- and a 10,000-node generation beats, and that no live node is taken for dead.
No cluster: the real Listener (node/liveness.py) in a process of its own on this host,
and sender processes that beat for every simulated node, each node once per beat
period, spread evenly over the period, each beat encoded and signed as a node's
entrypoint signs it.

Figures: task 0's listener CPU (user + system, its whole process) per second of wall
time, the beats it read against those sent, and the nodes it judged dead (target 0).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

from bench.report import Metric, Result
from nvrx_appliance.node import liveness
from nvrx_appliance.node import liveness_rule as rule

NAME = "beats"
TITLE = "16 liveness beats at scale"
SIZES = (1_000, 10_000)
WINDOW_S = 15.0  # beats sent for this long; the listener runs a little longer
SENDERS = 2
GEN = "bench/1/2026-01-01T00:00:00"
KEY = bytes(range(rule.KEY_BYTES))
CPU_TARGET = 0.25  # of one core, at 10,000 nodes: what task 0's entrypoint may spend


def _listen(nodes: int, seconds: float) -> None:
    """The listener's process: print its port, listen, print what it saw as JSON."""
    dead: list[str] = []
    found = liveness.Listener(
        GEN, KEY, timeout=10, nodes=nodes, on_dead=lambda s: dead.append(s.node),
        log=lambda line: None,
    )  # fmt: skip
    heard = 0
    real_hear = found.roll.hear

    def hear(node: str, now: float, task: int = -1) -> bool:
        nonlocal heard
        heard += 1
        return real_hear(node, now, task)

    found.roll.hear = hear  # type: ignore[method-assign]
    before = resource.getrusage(resource.RUSAGE_SELF)  # past the interpreter's start
    print(found.port, flush=True)
    found.start()
    time.sleep(seconds)  # the window the senders beat in
    found.stop()
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(json.dumps({"heard": heard, "dead": dead, "cpu_s": cpu}))


def _send(port: int, first: int, count: int, nodes: int, seconds: float) -> None:
    """One sender's process: beats for nodes first..first+count-1, one each per period."""
    import socket

    period = rule.beat_period(nodes)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    target = ("127.0.0.1", port)
    names = [f"node{n}" for n in range(first, first + count)]
    sent, seq, started = 0, 0, time.monotonic()
    while time.monotonic() - started < seconds:
        seq += 1
        begun = time.monotonic()
        for i, name in enumerate(names):
            due = begun + period * i / count
            lag = due - time.monotonic()
            if lag > 0.001:
                time.sleep(lag)  # pacing: each node's beat at its place in the period
            sock.sendto(rule.encode(KEY, rule.BEAT, GEN, name, 1 + i, seq), target)
            sent += 1
        left = begun + period - time.monotonic()
        if left > 0:
            time.sleep(left)
    print(json.dumps({"sent": sent}))


def one(nodes: int) -> dict:
    seconds = WINDOW_S
    listener = subprocess.Popen(
        [sys.executable, "-m", "bench.beats", "listen", str(nodes), str(seconds + 2)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert listener.stdout is not None
    port = int(listener.stdout.readline())
    per = nodes // SENDERS
    argv = [sys.executable, "-m", "bench.beats", "send", str(port)]
    shares = [[str(i * per), str(per), str(nodes), str(seconds)] for i in range(SENDERS)]
    senders = [subprocess.Popen([*argv, *share], stdout=subprocess.PIPE, text=True)
               for share in shares]  # fmt: skip
    sent = sum(json.loads(s.communicate()[0])["sent"] for s in senders)
    seen = json.loads(listener.communicate()[0].splitlines()[-1])
    return {
        "nodes": nodes, "sent": sent, "heard": seen["heard"], "dead": seen["dead"],
        "cpu_per_s": seen["cpu_s"] / (seconds + 2),
    }  # fmt: skip


def collect(h, repeat: int, result: Result) -> None:
    for nodes in SIZES:
        for _ in range(repeat):
            result.samples.append(one(nodes))


def finish(result: Result, floor: float | None) -> None:
    metrics = []
    for nodes in SIZES:
        runs = [s for s in result.samples if s["nodes"] == nodes]
        if not runs:
            continue
        metrics += [
            Metric(f"{nodes:,} nodes: task 0's listener CPU, of one core",
                   [s["cpu_per_s"] for s in runs], unit="core",
                   target_s=CPU_TARGET if nodes == SIZES[-1] else None),
            Metric("beats read / beats sent", [s["heard"] / max(1, s["sent"]) for s in runs],
                   unit="ratio", indent=True),
            Metric("nodes taken for dead", [float(len(s["dead"])) for s in runs],
                   unit="nodes", indent=True, target_s=0.0),
        ]  # fmt: skip
    result.metrics = metrics


if __name__ == "__main__":
    if sys.argv[1] == "listen":
        _listen(int(sys.argv[2]), float(sys.argv[3]))
    else:
        _send(*(int(a) for a in sys.argv[2:6]), float(sys.argv[6]))  # type: ignore[misc]
