"""The out-of-section timeout for a workload that never connects to NVRx's rank monitor.

NVRx 0.7.0 watches a rank only once the workload's own `RankMonitorClient` has
connected to that rank's monitor (rank_monitor_server.py: the InitMsg carries the
workload's pid, and the timeouts end that pid). A script that keeps the contract
without NVRx's optional sections never connects, so nothing ends it when it hangs:
`--out-of-section-timeout` would be a promise nobody keeps. The guard keeps it for
such a workload: when the workload's stack has not changed for that long (and, where
it is asleep or py-spy cannot read it, it used no CPU either), the guard writes why,
then ends it as NVRx's rank monitor does (SIGCONT, then SIGKILL). ft_launcher sees a
failed worker and restarts the cycle; the guard's stack watch judges the hang as after
NVRx's own timeout.

Whether the workload connected is read from the kernel, not guessed: the rank monitor
listens on the socket ft_launcher names in FT_RANK_MONITOR_IPC_SOCKET (one per local
rank), and a connection it accepted shows in /proc/net/unix with that path, connected
(state 03). Once one was seen in this cycle the guard never ends the workload itself:
NVRx's timeouts apply, unshortened, and the workload is killed once, by NVRx.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nvrx_appliance import files
from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.clock import now_iso
from nvrx_appliance.rank.sampler import (
    QUIET_WAKEUPS_PER_S,
    Sampler,
    computed,
    stopped_throughout,
)

SOCKET_ENV = "FT_RANK_MONITOR_IPC_SOCKET"  # NVRx's name (launcher.py)
UNIX_TABLE = Path("/proc/net/unix")
CONNECTED = "03"  # SS_CONNECTED in /proc/net/unix's St column
# The period of the guard's own look when the chain samples no stacks: /proc only.
PROC_PERIOD_S = 5.0
ASLEEP = ("S", "D", "T", "t", "I")


def still_name(node: str, rank: int, cycle: int) -> str:
    """The guard's own record of a stillness kill, in the generation's hangs dir (hidden:
    the hang record and the markers are what people read)."""
    return f".still.cycle{cycle}.{node}.rank{rank}.json"


def connected(path: str, table: str) -> bool:
    """Has a client connected to the Unix socket bound at `path`? `table` is
    /proc/net/unix's text: the listener's accepted connections carry its path."""
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7] == path and fields[5] == CONNECTED:
            return True
    return False


def moved(last: dict[str, Any], sample: dict[str, Any], period: float) -> bool:
    """Did the workload move between two samples? Its stack changed; its main thread
    woke (a loop paced by sleeps or I/O: the same stack, little CPU); or, asleep (or not
    readable by py-spy), it used CPU. A rank running in one Python call (state R, the
    same stack, no wakeups) is not moving: a GPU wait spins there. A rank stopped (T) at
    both samples that used no CPU has not moved, whatever py-spy read of it."""
    busy = computed(last, sample, period)
    if stopped_throughout(last, sample):
        return busy
    if last.get("frames") != sample.get("frames"):
        return True
    if sample.get("wakeups", 0) - last.get("wakeups", 0) > QUIET_WAKEUPS_PER_S * period:
        return True
    unseen = not sample.get("frames") or sample.get("state") in ASLEEP
    return unseen and busy


class Stillness:
    """Fed every sample of one workload; ends it past the out-of-section timeout while it
    never connected to its rank monitor."""

    def __init__(
        self,
        pid: int,
        timeout: float,
        socket_path: str,
        record: Path,
        who: dict[str, Any],
        say: Callable[[str], None],
    ):
        self.pid, self.timeout, self.socket_path = pid, timeout, socket_path
        self.record, self.who, self.say = record, who, say
        self.last: dict[str, Any] | None = None
        self.since = time.time()
        self.watched = False  # NVRx's rank monitor watches this workload
        self.ended = False
        self.sampler: Sampler | None = None  # its own, when the chain samples no stacks

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()

    def see(self, sample: dict[str, Any], period: float) -> None:
        if self.watched or self.ended:
            return
        with contextlib.suppress(OSError):
            if connected(self.socket_path, UNIX_TABLE.read_text()):
                self.watched = True
                return
        if self.last is not None and moved(self.last, sample, period):
            self.since = sample["epoch"]
        self.last = sample
        if sample["epoch"] - self.since >= self.timeout:
            self.end(sample)

    def end(self, sample: dict[str, Any]) -> None:
        """Write why, then SIGCONT and SIGKILL, as NVRx's rank monitor ends a rank."""
        self.ended = True
        still = sample["epoch"] - self.since
        where = next((f["name"] for f in sample.get("frames") or []), "")
        words = (
            f"rank {self.who['rank']} on {self.who['node']} stood still for {still:.0f} s "
            + (f"in `{where}` " if where else f"(state {sample.get('state')}, no CPU) ")
            + "and its workload never connected to NVRx's rank monitor: the guard ends it "
            f"as NVRx would past --out-of-section-timeout ({self.timeout:g} s)"
        )
        data = {**self.who, "by": "guard", "time": now_iso(), "epoch": time.time(),
                "still_since": self.since, "timeout": self.timeout, "words": words}  # fmt: skip
        with contextlib.suppress(OSError):
            files.make_private_dirs(self.record.parent)
            files.create_once(self.record, data)
        self.say(words)
        for signum in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(OSError):
                os.kill(self.pid, signum)


def watch(
    generation: str, pid: int, sampler: Sampler | None, say: Callable[[str], None]
) -> Stillness | None:
    """The stillness watch of a script workload under ft_launcher, started (on the stack
    sampler's samples, or on /proc alone when the chain samples no stacks); None for a
    built-in workload (it opens NVRx's sections) or outside ft_launcher."""
    socket_path = os.environ.get(SOCKET_ENV, "")
    try:
        manifest = run_manifest.load(Path(os.environ["NVRX_RUN_MANIFEST"]))
    except (KeyError, run_manifest.ManifestError):
        return None
    spec = manifest.spec
    if spec.workload != "script" or not socket_path:
        return None
    # The generation token is chain/array job id/submit time (node/control.py).
    array = generation.split("/")[1] if generation.count("/") >= 2 else ""
    rank = int(os.environ.get("RANK", "-1") or -1)
    cycle = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".", 1)[0]
    who = {"generation": generation, "node": node, "rank": rank, "cycle": cycle}
    found = Stillness(
        pid, float(spec.out_of_section_timeout), socket_path,
        manifest.layout.hangs(array) / still_name(node, rank, cycle), who, say,
    )  # fmt: skip
    if sampler is not None:
        before = sampler.on_sample

        def both(sample: dict[str, Any]) -> None:
            if before is not None:
                before(sample)
            found.see(sample, sampler.period)

        sampler.on_sample = both
    else:
        own = Sampler(pid, None, PROC_PERIOD_S, {}, say)
        own.on_sample = lambda sample: found.see(sample, PROC_PERIOD_S)
        found.sampler = own
        own.start()
    return found
