"""The judgement when a hang is cut short, from each rank's stack.

Every rank's guard keeps its workload's last stack (rank/sampler.py), and each node's
entrypoint publishes its ranks' stacks in the generation's work dir (one file per node,
node/stack_publisher.py; a guard outside the entrypoint writes its own):

    nvrx/<array job id>/stacks/cycle<N>/<node>.json             (owner-only)
    nvrx/<array job id>/stacks/cycle<N>/<node>.rank<R>.json

When NVRx's step or section timeout fires, its rank monitor sends the workload SIGCONT
then SIGKILL (rank_monitor_server.py, _shutdown_rank). The guard sees that death first,
before ft_launcher does; the first guard to see it judges the cycle's hang from every
rank's last stack (hang_rule.judge) and writes the hang record, once per cycle:

    nvrx/<array job id>/hangs/cycle<N>.json     the judgement, the stacks grouped
    nvrx/<array job id>/hangs/hung.<node>       a node the verdict named
    nvrx/<array job id>/hangs/withdrawn.<node>  its verdict withdrawn: its ranks moved

The node health check (node/health_check.py) answers unhealthy for a named node, so it
leaves at the next rendezvous; the teardown's node memory keeps it out of the chain's
later generations (evidence "hung"). A record that says `hand_off` (no free hot spare)
makes task 0 end the generation (node/lifecycle.py), so that the next one starts without
the node instead of the run going round on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nvrx_appliance import files
from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.clock import now_iso
from nvrx_appliance.manifest import Manifest
from nvrx_appliance.observe import run_files
from nvrx_appliance.observe.slurm_output import expand_nodelist
from nvrx_appliance.rank import flight, hang_rule, kill_cause, stall_rule
from nvrx_appliance.rank.sampler import LOCAL_STACKS_ENV, Sampler

VERDICT = "verdict.json"  # node/stack_publisher.py's copy of this node's hang marker

RECORD_VERSION = 1
SAMPLE_BYTES = 256 << 10  # a sample file read back (deep stacks are a few kB)
NODE_SAMPLES_BYTES = 8 << 20  # a node's published samples: its ranks' together
# A guard that did not judge its cycle waits this long for the judging one's record; a
# judgement reads one small file per rank (milliseconds for thousands).
JUDGE_WAIT_S = 10.0
JUDGE_POLL_S = 0.1
KILLED = 128 + 9  # the code a guard sees for a workload that SIGKILL ended
# NVRx's rank monitor looks every workload_check_interval (config.py: 5 s by default).
NVRX_CHECK_INTERVAL_S = 5.0
# The node's NVLink domain in segment mode, as the entrypoint tells the workload.
DOMAIN_ENV = "NVRX_APPLIANCE_NVLINK_DOMAIN"
CYCLE_INFO_BYTES = 64 << 10
MAX_CYCLE_INFOS = 1000


# --- pure ---------------------------------------------------------------------------


def rank_stack(sample: dict[str, Any]) -> hang_rule.RankStack:
    """A sample file's content as the rule reads it. Raises KeyError/TypeError/ValueError
    on a sample that is not one."""
    return hang_rule.RankStack(
        rank=int(sample["rank"]),
        node=str(sample["node"]),
        frames=tuple(
            hang_rule.Frame(str(f["name"]), str(f["file"]), int(f.get("line", 0)))
            for f in sample["frames"]
        ),
        taken=float(sample["epoch"]),
        still_since=float(sample["still_since"]),
        domain=str(sample.get("domain", "")),
        state=str(sample.get("state", "")),
        native=tuple(str(n) for n in sample.get("native") or ()),
        wchan=str(sample.get("wchan") or ""),
        same_since=float(sample["same_since"]) if sample.get("same_since") else None,
    )


def sample_name(node: str, rank: int) -> str:
    return f"{node}.rank{rank}.json"


def hung_name(node: str) -> str:
    return f"hung.{node}"


def withdrawn_name(node: str) -> str:
    return f"withdrawn.{node}"


def _int(text: str | None, default: int) -> int:
    return int(text) if text and text.isdecimal() else default


def record_of(
    judgement: hang_rule.Judgement,
    samples: list[dict[str, Any]],
    *,
    generation: str,
    cycle: int,
    judged_by: dict[str, str],
    hand_off: bool,
) -> dict[str, Any]:
    """The hang record: what was decided, why, and the stacks grouped as a person reads
    them ("4 ranks on node1, node2 waited in all_reduce: <stack>"). Where py-spy could not
    read the ranks at all, the record says so and why (rank/sampler.py: no_stacks)."""
    no_stacks = sorted({str(s["no_stacks"]) for s in samples if s.get("no_stacks")})
    return {
        "version": RECORD_VERSION,
        "generation": generation,
        "cycle": cycle,
        "time": now_iso(),
        "verdict": judgement.kind or "none",  # hung, workload (its own stall) or none
        "stalled": judgement.stalled,
        "held": judgement.held,
        "flight": list(judgement.flight),
        "nodes": list(judgement.nodes),
        "words": judgement.words + (f"; no stacks: {no_stacks[0]}" if no_stacks else ""),
        "no_stacks": no_stacks,
        "hand_off": hand_off and judgement.verdict,
        "judged_by": judged_by,
        "groups": [
            {
                "where": g.where,
                "waiting": g.waiting,
                "ranks": list(g.ranks),
                "nodes": list(g.nodes),
                "frames": [asdict(f) for f in g.frames],
            }
            for g in judgement.groups
        ],
        "stacks": sorted(samples, key=lambda s: int(s.get("rank", 0))),
    }


# --- shell ---------------------------------------------------------------------------


def read_json(path: Path, limit: int = SAMPLE_BYTES) -> dict[str, Any] | None:
    """A small JSON object file; None when absent, torn or not an object."""
    try:
        data = json.loads(files.read_text(path, limit) or "")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_samples(directory: Path) -> list[dict[str, Any]]:
    """Every rank's last sample of one cycle; a torn or foreign file is skipped. A node's
    publisher keeps its ranks' samples in one file (`<node>.json`, {"samples": [...]},
    node/stack_publisher.py); a guard without one keeps its own (`<node>.rank<R>.json`)."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    found = (
        read_json(directory / n, NODE_SAMPLES_BYTES)
        for n in names
        if n.endswith(".json") and n[0] != "."
    )
    samples: list[dict[str, Any]] = []
    for data in found:
        if data is not None and isinstance(data.get("samples"), list):
            samples += [s for s in data["samples"] if isinstance(s, dict)]
        elif data is not None:
            samples.append(data)
    return samples


def read_cycles(directory: Path) -> list[tuple[set[str], set[str]]]:
    """(active, standby) nodes of the generation's cycles so far, oldest first."""
    try:
        names = [n for n in os.listdir(directory) if run_files.cycle_file_name(n)]
    except OSError:
        return []
    cycles = []
    for name in names[:MAX_CYCLE_INFOS]:
        try:
            cycle = run_files.cycle_info(files.read_text(directory / name, CYCLE_INFO_BYTES) or "")
        except OSError:
            continue
        if cycle is not None:
            active, standby = (
                expand_nodelist(cycle.active_nodes),
                expand_nodelist(cycle.standby_nodes),
            )
            cycles.append(((cycle.attempt, cycle.number), set(active), set(standby)))
    return [(active, standby) for _, active, standby in sorted(cycles, key=lambda c: c[0])]


# --- the judgement -------------------------------------------------------------------


def fresh_s(period: float) -> float:
    """How old a rank's last stack may be at the judgement while its guard still samples
    it: a period's wait between two looks, a non-blocking read of up to a period
    (rank/sampler.py), a period before the node's publisher puts it on the shared file
    system, and NVRx's rank check interval (5 s), since a peer killed a check earlier
    stopped sampling. An older one is no evidence: its sampler stopped."""
    return 3 * period + NVRX_CHECK_INTERVAL_S


def still_s(period: float) -> float:
    """How long both sides must have stood still: three samples alike."""
    return 2 * period


def free_hot_spares(hot_spare_nodes: int, cycles: list[tuple[set[str], set[str]]]) -> int:
    """How many hot spares the generation still holds, from its cycles' (active, standby)
    nodes, oldest first: the standby nodes NVRx lists, or (NVRx 0.7.0 does not always list
    them) the spares less those that came into the active set since cycle 0."""
    if not cycles:
        return hot_spare_nodes
    first, _ = cycles[0]
    used = set().union(*(active for active, _ in cycles)) - first
    return max(len(cycles[-1][1]), hot_spare_nodes - len(used))


class StackWatch:
    """What the guard runs beside one workload: the sampler, and the judgement when
    NVRx's timeout kills the workload."""

    def __init__(self, manifest: Manifest, generation: str, pid: int, say: Callable[[str], None]):
        spec = manifest.spec
        self.say = say
        self.period = float(spec.stack_sampling)
        self.segment = spec.segment not in ("off",)
        self.generation = generation
        self.hot_spare_nodes = spec.hot_spares * spec.nodes_per_task
        self.out_of_section = float(spec.out_of_section_timeout)
        # The generation token is chain/array job id/submit time (node/control.py).
        self.array_job_id = generation.split("/")[1] if generation.count("/") >= 2 else ""
        layout = manifest.layout
        self.cycle = _int(os.environ.get("TORCHELASTIC_RESTART_COUNT"), 0)
        self.node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".", 1)[0]
        self.rank = _int(os.environ.get("RANK"), -1)
        self.world_size = _int(os.environ.get("WORLD_SIZE"), 0)
        self.samples = layout.stacks(self.array_job_id) / f"cycle{self.cycle}"
        self.hangs = layout.hangs(self.array_job_id)
        self.cycle_infos = layout.cycle_infos(self.array_job_id)
        who = {
            "generation": generation, "cycle": self.cycle, "node": self.node,
            "rank": self.rank, "world_size": self.world_size,
            "domain": os.environ.get(DOMAIN_ENV, ""),
        }  # fmt: skip
        # Set by the guard when torch elastic stops the workers (its TERM)
        self.stopping = threading.Event()
        # the frames the verdict judged of this rank, once read; False: it held no one
        self._judged: list[dict[str, Any]] | bool | None = None
        self.sampler = Sampler(
            pid, self.samples / sample_name(self.node, self.rank), self.period, who, say,
            on_sample=self._moved_since_verdict,
        )  # fmt: skip

    def _moved_since_verdict(self, sample: dict[str, Any]) -> None:
        """A verdict is withdrawn when a rank it held (one the others waited for) turns out
        to be moving: its stack is no longer the one the judgement read, and it is neither
        stopped nor in the kernel. A sibling that waited, or any rank while torch elastic
        stops the workers, proves nothing. The marker is looked for where the node's
        publisher keeps it (one look per node and period), not on the shared file system
        at every sample."""
        if self.stopping.is_set() or sample.get("state") in hang_rule.NOT_WAITING_STATES:
            return
        if self._judged is None:
            local = os.environ.get(LOCAL_STACKS_ENV)
            marker = read_json(
                (Path(local) / VERDICT) if local else self.hangs / hung_name(self.node)
            )
            if marker is None:
                return
            if marker.get("generation") != self.generation or marker.get("cycle") != self.cycle:
                self._judged = False  # an earlier cycle's verdict: judged then
                return
            record = read_json(self.hangs / f"cycle{self.cycle}.json")
            if record is None or record.get("generation") != self.generation:
                return
            held = (record.get("held") or {}).get(self.node) or []
            judged = next((s for s in record.get("stacks", []) if s.get("rank") == self.rank), None)
            self._judged = judged.get("frames") if judged and self.rank in held else False
        if self._judged is False or self._judged == sample["frames"]:
            return
        words = f"{self.node}'s rank {self.rank} moved again after the hang verdict: withdrawn"
        data = {
            "generation": self.generation,
            "cycle": self.cycle,
            "time": now_iso(),
            "words": words,
        }
        with contextlib.suppress(OSError):
            if files.create_once(self.hangs / withdrawn_name(self.node), data):
                self.say(words)

    def after_exit(self, code: int, *, stopping: bool, watchdog: str | None = None) -> bool:
        """The workload ended with `code`: judge the cycle's hang when NVRx (or the guard's
        stillness watch) killed it, or NCCL's watchdog aborted it (exit 134 after its
        "Watchdog caught collective operation timeout": `watchdog`, the op and how long it
        ran); not when torch elastic stopped the workers, which TERMs the guard too.
        Whether it was judged as a hang."""
        self.sampler.close()
        hang = code == KILLED or (code == kill_cause.ABORTED and watchdog is not None)
        if not hang or stopping or self.world_size <= 0:
            return False
        try:
            self.judge(watchdog)
        except OSError as exc:
            self.say(f"could not judge the hang of cycle {self.cycle}: {exc}")
        return True

    def judge(self, watchdog: str | None = None) -> None:
        """One guard of the cycle judges (it claims the cycle first); the others wait for
        its record, so that the named nodes are marked before any of them exits: a node's
        ft_launcher asks the health check only once its workers are gone."""
        files.make_private_dirs(self.hangs)
        path = self.hangs / f"cycle{self.cycle}.json"
        claim = {"generation": self.generation, "node": self.node, "rank": self.rank}
        if files.create_once(self.hangs / f".cycle{self.cycle}.claim", claim):
            self.judge_first(path, watchdog)
            return
        deadline = time.monotonic() + JUDGE_WAIT_S
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(JUDGE_POLL_S)

    def verdict(self) -> dict[str, str] | None:
        """The cycle's hang verdict as the record says it ({"verdict", "words"}), where it
        explains the kill (explains_kill); None otherwise, or when there is none (yet)."""
        record = read_json(self.hangs / f"cycle{self.cycle}.json")
        if record is None or record.get("generation") != self.generation:
            return None
        if not explains_kill(record):
            return None
        return {"verdict": str(record.get("verdict")), "words": str(record.get("words"))}

    def judge_first(self, path: Path, watchdog: str | None = None) -> None:
        samples = [
            s for s in read_samples(self.samples)
            if s.get("generation") == self.generation and s.get("cycle") == self.cycle
        ]  # fmt: skip
        stacks = []
        for sample in samples:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                stacks.append(rank_stack(sample))
        dumps = flight.read_dumps(self.samples, self.generation, self.cycle)
        now = time.time()
        judgement = stall_rule.judge(
            stacks, dumps, world_size=self.world_size, cycle=self.cycle, now=now,
            fresh_s=fresh_s(self.period), still_s=still_s(self.period), segment=self.segment,
        )  # fmt: skip
        ended = ended_by(watchdog, self.still_killed(), self.out_of_section)
        if judgement.kind == "workload" or watchdog:
            judgement = dataclasses.replace(
                judgement, words=judgement.words + "; " + ended + advice(judgement.kind, watchdog)
            )
        spares = free_hot_spares(self.hot_spare_nodes, read_cycles(self.cycle_infos))
        hand_off = judgement.verdict and spares < len(judgement.nodes)
        record = record_of(
            judgement, samples, generation=self.generation, cycle=self.cycle,
            judged_by={"node": self.node, "rank": str(self.rank)}, hand_off=hand_off,
        )  # fmt: skip
        # NCCL's watchdog timed a collective out: that cycle stood still
        record["stood_still"] = bool(watchdog) or stood_still(
            stacks, dumps, now=now, still_s=still_s(self.period)
        )
        for node in judgement.nodes:  # the markers first: the record says they are there
            files.create_once(self.hangs / hung_name(node), marker_of(record))
        files.create_once(path, record)
        self.say(judgement.words + (
            "; no free hot spare: the generation hands off" if hand_off else ""
        ))  # fmt: skip

    def still_killed(self) -> bool:
        """Did the guards' stillness watch end a rank of this cycle (its record is there)?"""
        try:
            mark = f".still.cycle{self.cycle}."
            return any(n.startswith(mark) for n in os.listdir(self.hangs))
        except OSError:
            return False


def explains_kill(record: dict[str, Any]) -> bool:
    """Does a hang record account for its cycle's kills (so that node memory never counts
    them as a node's own failures)? When it named the hung node or the workload's own
    stall, or, naming nobody, the cycle stood still (a collective stood pending long
    enough for a summary, or every rank's stack stood still): a hang the evidence could
    not place. Not a rank killed while the others trained: that kill is counted as any
    failure of its node is."""
    return record.get("verdict") in ("hung", "workload") or record.get("stood_still") is True


def stood_still(
    stacks: list[hang_rule.RankStack], dumps: list, *, now: float, still_s: float
) -> bool:
    """Did the cycle stand still when it was judged: a collective pending past the stall
    time (a summary written), or every rank's stack still for the still time?"""
    return bool(dumps) or (bool(stacks) and all(now - s.still_since >= still_s for s in stacks))


def ended_by(watchdog: str | None, still_killed: bool, out_of_section: float) -> str:
    """What ended the hung cycle, in words."""
    if watchdog:
        return f"NCCL's watchdog aborted the ranks (exit 134): {watchdog}"
    if still_killed:
        return (f"the guards ended the still ranks past --out-of-section-timeout "
                f"({out_of_section:g} s)")  # fmt: skip
    return "NVRx's timeout ended the ranks"


def advice(kind: str, watchdog: str | None) -> str:
    """What a person does about a stall of the workload's own work that a timeout ended."""
    if kind != "workload":
        return ""
    if watchdog:
        return ("; if that work is the workload's (a save, an evaluation, an upload), raise "
                "NCCL's timeout (init_process_group's `timeout`, Megatron's "
                "--distributed-timeout-minutes)")  # fmt: skip
    return ("; if that work is the workload's (a save, an evaluation, an upload), raise the "
            "timeout or open NVRx's checkpointing section around it")  # fmt: skip


def marker_of(record: dict[str, Any]) -> dict[str, Any]:
    """What a named node's marker says: its generation and cycle, the verdict's words,
    the record it came from, whether the generation hands off."""
    return {
        "generation": record.get("generation"), "cycle": record.get("cycle"),
        "words": record.get("words"), "record": f"cycle{record.get('cycle')}.json",
        "hand_off": bool(record.get("hand_off")),
    }  # fmt: skip


def watch(generation: str, pid: int, say: Callable[[str], None]) -> StackWatch | None:
    """The stack watch of one workload, started; None when the chain samples no stacks."""
    try:
        manifest = run_manifest.load(Path(os.environ["NVRX_RUN_MANIFEST"]))
    except (KeyError, run_manifest.ManifestError):
        return None  # the guard says why when it judges an exit
    if manifest.spec.stack_sampling <= 0:
        return None
    found = StackWatch(manifest, generation, pid, say)
    found.sampler.start()
    return found


def hand_off_wanted(hangs: Path, generation: str) -> str | None:
    """Why the generation must hand off: a standing hang verdict of this generation that
    found no free hot spare (its marker says hand_off); None otherwise. Task 0 reads it
    (node/looks.py) and closes the generation, so the next one starts without the node."""
    try:
        names = sorted(n for n in os.listdir(hangs) if n.startswith("hung."))
    except OSError:
        return None
    for name in names:
        node = name.removeprefix("hung.")
        marker = read_json(hangs / name)
        if (
            marker is None
            or not marker.get("hand_off")
            or marker.get("generation") != generation
            or os.path.lexists(hangs / withdrawn_name(node))
        ):
            continue
        return f"{marker.get('words')}; no free hot spare, so the generation hands off"
    return None
