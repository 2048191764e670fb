"""A slow node named for the ledger, and under `--straggler-action replace` it leaves at
the next checkpoint and a spare joins, when that pays (docs/stragglers.md).

Task 0's entrypoint judges: every LOOK_S it reads the generation's training record (the
progress log, as it grows). Each straggler of the newest cycle it names in
Layout.straggler_named (JSON: the node, its cycle, slowdown, the time lost, what was
done about it), which task 0's teardown puts in the generation's ledger entry. Under
`replace`, when a straggler's cost until the generation ends exceeds the chain's measured
restart cost (goodput/straggler.py), it writes the decision for that node
(Layout.straggler_leave: key=value lines naming the generation, the node, the checkpoint
iteration when it decided, the words), once.

The named node's own entrypoint acts: once the tracker names a checkpoint after that
iteration (so the restart loses no training), it ends its own ranks (SIGKILL, as
NVRx's own timeout does); NVRx restarts the cycle, and before the rendezvous this node's
health check answer (health_check.py) says it leaves, so its ft_launcher exits and a hot
spare takes its place, exactly as for a drained node. Task 0's own node is never asked
to leave this way: that would end the generation; it is named and reported only.

Megatron's straggler report names ranks, not nodes: nothing here acts on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from nvrx_appliance import files
from nvrx_appliance.clock import now_iso
from nvrx_appliance.files import make_private_dirs, write_atomic
from nvrx_appliance.goodput import gather, straggler
from nvrx_appliance.manifest import Manifest
from nvrx_appliance.node import control, time_limit
from nvrx_appliance.observe import workdir
from nvrx_appliance.rank import kill_cause
from nvrx_appliance.settings.generation_end import slurm_seconds

REPLACE = "replace"
# What was done about a straggler, where no decision was weighed (the ledger's words).
REPORTED = "reported: --straggler-action report names it and changes nothing"
OWN_NODE = "kept: task 0's own node is not replaced in-job (that would end the generation)"
NO_LIMIT = "kept: the generation has no time limit to weigh its cost against"
# A straggler's verdict needs 120 steps; a look every 10 s costs a read of what the
# progress log gained and is soon enough for a decision worth minutes.
LOOK_S = 10.0
DECISION_BYTES = 16 << 10


def decision(generation: str, node: str, iteration: int | None, found: straggler.Straggler,
             why: str) -> str:  # fmt: skip
    return control.encode_fields(
        {
            "generation": generation,
            "node": node,
            "iteration": iteration if iteration is not None else 0,
            "cycle": found.cycle,
            "slowdown": f"{found.slowdown:.2f}",
            "words": found.words,
            "why": why,
            "time": now_iso(),
        }
    )


def named(generation: str, found: straggler.Straggler, action: str) -> dict[str, object]:
    """A straggler as the ledger keeps it (Layout.straggler_named)."""
    return {
        "generation": generation,
        "node": found.node,
        "cycle": found.cycle,
        "slowdown": round(found.slowdown, 2),
        "lost_s": round(found.lost_s),
        "action": action,
        "words": found.words,
    }


def leaving(text: str | None, generation: str, node: str) -> str | None:
    """Why this node leaves at this rendezvous (for the health check answer), or None
    when the decision is absent, of another generation, or about another node."""
    if not text:
        return None
    fields = control.decode_fields(text)
    if not control.same_generation(fields.get("generation", ""), generation):
        return None
    if fields.get("node") != node:
        return None
    return f"a straggler: {fields.get('words', '')}; {fields.get('why', '')}; {node} leaves"


def read_decision(path: Path, uid: int | None = None) -> str | None:
    """The decision's text when this job's user wrote it (a file nobody else could have
    written); None otherwise."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    owner = os.geteuid() if uid is None else uid
    if not stat.S_ISREG(st.st_mode) or st.st_uid != owner or st.st_mode & 0o022:
        return None
    with contextlib.suppress(OSError):
        return files.read_text(path, DECISION_BYTES)
    return None


class StragglerLeave(threading.Thread):
    """The judge (task 0) and the leaver (any other node) of one generation."""

    def __init__(
        self,
        manifest: Manifest,
        *,
        array_job_id: str,
        generation: str,
        node: str,
        is_task0: bool,
        replacing: bool,
        started: float,
        workload: Sequence[str],
        log: Callable[[str], None],
    ) -> None:
        super().__init__(name="straggler-leave", daemon=True)
        self.layout = manifest.layout
        self.array_job_id, self.generation, self.node = array_job_id, generation, node
        self.is_task0, self.workload, self.log = is_task0, list(workload), log
        self.replacing = replacing
        limit = slurm_seconds(str(manifest.spec.time_limit))
        self.ends_at = started + limit if limit else None  # monotonic
        self._memo = gather.LogMemo()
        self._said: set[str] = set()
        self._decided: dict[str, str] = {}  # node -> why it leaves
        self._named: dict[str, dict[str, object]] = {}  # node -> what its file says
        self._ended = False
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        while not self._stop.wait(LOOK_S):
            try:
                if self.is_task0:
                    self._judge()
                else:
                    self._leave_if_told()
            except Exception as exc:  # a look that fails must never end the node
                self._say_once("error", f"straggler look failed: {exc}")

    # --- task 0 -----------------------------------------------------------------------

    def _judge(self) -> None:
        work = gather.training_record(self.layout.work_dir, {self.array_job_id: []}, self._memo)
        mine = [w for (g, _), w in work.items() if g == self.array_job_id]
        if not mine:
            return
        current = max(mine, key=lambda w: w.cycle)
        restart = straggler.restart_cost(list(work.values()), current) if self.replacing else None
        for found in straggler.judge(current):
            if found.by_rank:
                continue
            action, replace = self._act(found, restart)
            self._say_once(f"{found.node}:{action.split(':', 1)[0]}", f"{found.words}; {action}")
            if replace:
                self._decide(found, action)
            self._keep_named(found, action)

    def _act(
        self, found: straggler.Straggler, restart: tuple[float | None, str] | None
    ) -> tuple[str, bool]:
        """What is done about a straggler, in words (replaced, kept or reported), and
        whether it is to be decided now that it leaves."""
        if not self.replacing or restart is None:
            return REPORTED, False
        if found.node in self._decided:
            return self._decided[found.node], False
        if found.node == self.node:
            return OWN_NODE, False
        if self.ends_at is None:
            return NO_LIMIT, False
        seconds_left = self.ends_at - time.monotonic()
        replace, why = straggler.worth_replacing(found, seconds_left, None, restart)
        return why, replace

    def _keep_named(self, found: straggler.Straggler, action: str) -> None:
        """Its file for the ledger, rewritten only when what it says changed."""
        record = named(self.generation, found, action)
        if self._named.get(found.node) == record:
            return
        path = self.layout.straggler_named(self.array_job_id, found.node)
        make_private_dirs(path.parent)
        write_atomic(path, json.dumps(record) + "\n", 0o600)
        self._named[found.node] = record

    def _decide(self, found: straggler.Straggler, why: str) -> None:
        path = self.layout.straggler_leave(self.array_job_id, found.node)
        make_private_dirs(path.parent)
        iteration = workdir.checkpoint_iteration(self.layout)
        write_atomic(path, decision(self.generation, found.node, iteration, found, why), 0o600)
        self._decided[found.node] = why
        self.log(f"{found.node} leaves after the next checkpoint (after iteration "
                 f"{iteration or 0}); a spare takes its place")  # fmt: skip

    # --- the straggler's own node -------------------------------------------------------

    def _leave_if_told(self) -> None:
        if self._ended:
            return
        text = read_decision(self.layout.straggler_leave(self.array_job_id, self.node))
        if leaving(text, self.generation, self.node) is None or text is None:
            return
        after = int(control.decode_fields(text).get("iteration") or 0)
        now = workdir.checkpoint_iteration(self.layout)
        if now is None or now <= after:
            return  # until the next checkpoint: a restart then loses no training
        # Said before the kill: the ranks' guards must not judge this SIGKILL a hang.
        mark = self.layout.stragglers(self.array_job_id) / kill_cause.ended_name(self.node)
        write_atomic(mark, json.dumps({"generation": self.generation, "node": self.node,
                                       "time": now_iso()}) + "\n", 0o600)  # fmt: skip
        ended = time_limit.end_workers(self.workload)
        self._ended = True
        self.log(f"{self.node} is a straggler told to leave; the checkpoint at iteration "
                 f"{now} is kept: ended its {ended} rank(s), it leaves at this rendezvous")  # fmt: skip

    def _say_once(self, key: str, message: str) -> None:
        """Once per node and outcome: the verdict is looked at every LOOK_S."""
        if key not in self._said:
            self._said.add(key)
            self.log(message)


def wanted(manifest: Manifest) -> bool:
    return manifest.spec.straggler_action == REPLACE
