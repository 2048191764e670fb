"""What task 0 does with a node its liveness judge found dead (node/liveness.py).

It writes the death down once, in the generation's deaths directory (Layout.deaths),
where the teardown's node memory, `status`, `report` and the watcher read it:

    nvrx/<array job id>/deaths/dead.<node>                  the death, in words (JSON)
    nvrx/<array job id>/deaths/stopped.<node>.cycle<N>      task 0 ended its own ranks for it

and then, by what the node was doing when it died (the newest cycle-info file, which
task 0 itself writes when a round closes):

- it trained in the current cycle, and nothing else has noticed (task 0's own ranks
  still run): this is the silent death, and the survivors wait on it inside a
  collective. With a free hot spare, task 0
  ends its own ranks (SIGKILL, as NVRx's own timeouts do), having first written why, so
  that their guards judge no hang and no node is charged with the failure. NVRx then does
  what it does for any failed rank: it opens the next round, every surviving launcher
  joins it and stops its workers, and the hot spare takes the dead node's place. Without
  a free hot spare the cycle could not form again until the join timeout: task 0 closes
  the generation instead, and the next one starts without the node (the hand-off).
- it trained in an earlier cycle only, or NVRx has already stopped task 0's ranks: its
  ranks failed first and NVRx's own restart is under way or done (a crash: its peers
  read a reset), and now it is gone too;
- it never trained in this generation: a hot spare left the pool; training goes on.

Every form is remembered like any bad node: the node is kept out of the chain's later
generations for --exclude-for.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvrx_appliance import files
from nvrx_appliance.clock import iso_utc, now_iso
from nvrx_appliance.manifest import Manifest
from nvrx_appliance.node import liveness_rule, rendezvous, time_limit
from nvrx_appliance.observe import deaths, run_files
from nvrx_appliance.observe.slurm_output import expand_nodelist
from nvrx_appliance.rank import stacks

RECORD_VERSION = 1


def short(host: str) -> str:
    return host.split(".", 1)[0]


@dataclass(frozen=True)
class CycleSeen:
    number: int  # NVRx's cycle (its rendezvous round: the workers' TORCHELASTIC_RESTART_COUNT)
    active: frozenset[str]  # short host names
    standby: frozenset[str]


def read_cycles(directory: Path) -> list[CycleSeen]:
    """The generation's cycles so far, oldest first, from NVRx's cycle-info files."""
    try:
        names = sorted(n for n in os.listdir(directory) if run_files.cycle_file_name(n))
    except OSError:
        return []
    found = []
    for name in names[: stacks.MAX_CYCLE_INFOS]:
        with contextlib.suppress(OSError):
            cycle = run_files.cycle_info(
                files.read_text(directory / name, stacks.CYCLE_INFO_BYTES) or ""
            )
            if cycle is not None:
                seen = CycleSeen(
                    cycle.number,
                    frozenset(short(n) for n in expand_nodelist(cycle.active_nodes)),
                    frozenset(short(n) for n in expand_nodelist(cycle.standby_nodes)),
                )
                found.append(((cycle.attempt, cycle.number), seen))
    return [seen for _, seen in sorted(found, key=lambda pair: pair[0])]


def standing(node: str, cycles: list[CycleSeen]) -> tuple[str, int]:
    """What `node` was doing when it died, from the generation's cycles (oldest first):
    (deaths.SILENT, the current cycle) when it trains in the current one, (deaths.CRASHED,
    the last cycle it trained in) when only an earlier one, else (deaths.SPARE, -1)."""
    me = short(node)
    for seen in reversed(cycles):
        if me in seen.active:
            return (deaths.SILENT if seen is cycles[-1] else deaths.CRASHED), seen.number
    return deaths.SPARE, -1


def words(node: str, kind: str, last_heard: float, cycle: int, silent_s: float) -> str:
    """What a person reads at 3 a.m.: "node2 stopped answering at 18:33:41 UTC; no
    reset, no exit: a silent death (no liveness beat for 11 s in cycle 0)"."""
    at = (iso_utc(last_heard) or "")[11:19]
    if kind == deaths.SILENT:
        return (f"{node} stopped answering at {at} UTC; no reset, no exit: a silent death "
                f"(no liveness beat for {silent_s:.0f} s in cycle {cycle})")  # fmt: skip
    if kind == deaths.CRASHED:
        return (f"{node} stopped answering at {at} UTC, after NVRx had ended cycle {cycle} "
                "on its own: its ranks failed first (a crash), and the node is gone (no "
                f"liveness beat for {silent_s:.0f} s)")  # fmt: skip
    return (f"hot spare {node} stopped answering at {at} UTC (no liveness beat for "
            f"{silent_s:.0f} s): it leaves the spare pool; training goes on")  # fmt: skip


class DeadNodes:
    """Task 0's `on_dead` for the liveness listener."""

    def __init__(
        self,
        manifest: Manifest,
        *,
        array_job_id: str,
        generation: str,
        me: str,
        control_dir: Path,
        workload: Sequence[str],
        log: Callable[[str], None],
        training: Callable[[], bool] | None = None,
    ):
        layout = manifest.layout
        self.deaths = layout.deaths(array_job_id)
        self.cycle_infos = layout.cycle_infos(array_job_id)
        self.hot_spare_nodes = manifest.spec.hot_spares * manifest.spec.nodes_per_task
        self.generation = generation
        self.me = me
        self.control_dir = control_dir
        self.workload = list(workload)
        self.log = log
        # Whether task 0's own ranks still run: while they do, nothing has noticed the death.
        self.training = training or (lambda: bool(time_limit.own_workers(self.workload)))
        self.replaced: dict[int, int] = {}  # cycle -> its nodes this judge took out

    def __call__(self, silent: liveness_rule.Silent) -> None:
        cycles = read_cycles(self.cycle_infos)
        kind, cycle = standing(silent.node, cycles)
        if kind == deaths.SILENT and not self.training():
            # NVRx already stopped task 0's ranks: the death reset its peers' sockets (a
            # crash), and NVRx's own restart is under way; the next round has not closed.
            kind = deaths.CRASHED
        last_heard = time.time() - (time.monotonic() - silent.last_heard)
        said = words(silent.node, kind, last_heard, cycle, silent.silent_s)
        hand_off = False
        if kind == deaths.SILENT:
            self.replaced[cycle] = self.replaced.get(cycle, 0) + 1
            spares = stacks.free_hot_spares(
                self.hot_spare_nodes, [(set(c.active), set(c.standby)) for c in cycles]
            )
            # A node of task 0's own array task: the cycle cannot form again around task
            # 0 without it, and only a new generation replaces task 0's task whole.
            hand_off = spares < self.replaced[cycle] or silent.task == 0
        record = {
            "version": RECORD_VERSION,
            "generation": self.generation,
            "node": silent.node,
            "kind": kind,
            "cycle": cycle,
            "last_heard": iso_utc(last_heard),
            "silent_s": round(silent.silent_s, 1),
            "time": now_iso(),
            "hand_off": hand_off,
            "words": said,
        }
        files.make_private_dirs(self.deaths)
        if not files.create_once(self.deaths / deaths.dead_name(silent.node), record):
            return  # judged already (a listener restarted): once per generation
        said = deaths.sentence(deaths.Death.of(record))
        self.log(said)
        if kind != deaths.SILENT:
            return
        if hand_off:
            rendezvous.announce_end(self.control_dir, self.generation, said)
            return
        # Said before the kill: the ranks' guards must not take it for a hang or a failure.
        mark = {"generation": self.generation, "node": self.me, "cycle": cycle,
                "dead": silent.node, "words": said}  # fmt: skip
        with contextlib.suppress(FileExistsError):
            files.write_atomic(
                self.deaths / deaths.stopped_name(self.me, cycle), json.dumps(mark) + "\n", 0o600
            )
        ended = time_limit.end_workers(self.workload)
        self.log(f"ended this node's {ended} rank(s) so that NVRx restarts the cycle without "
                 f"{silent.node}")  # fmt: skip
