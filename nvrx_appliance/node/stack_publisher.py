"""One writer per node for the ranks' stack samples on the shared file system.

Each rank's guard samples its workload every `--stack-sampling` seconds
(rank/sampler.py). Written straight to the shared work dir, that is a handful of
metadata operations per rank per period in one directory (measured: 4 per sample:
mkdir, stat, create, rename), about 16 thousand a second at 2,048 nodes of 8 ranks. So
the entrypoint names a node-local directory (LOCAL_STACKS_ENV, in /tmp) where its
ranks' guards keep their samples, and publishes them every period as one file per node:

    nvrx/<array job id>/stacks/cycle<N>/<node>.json     {"node", "time", "samples": [...],
                                                         "waits": [...]}

`waits` are its ranks' times inside collectives, which their flight-recorder watch keeps
in `cycle<N>/waits/` of the same local directory (rank/flight_site/sitecustomize.py,
docs/stragglers.md); `flight` the recorder summaries of its ranks whose collective stood
still (`cycle<N>/flight/`, rank/flight.py). Written by rename, only when a sample, a
figure or a summary changed: O(1) per node per period, whatever the ranks and whatever
they do (training, waiting through rank 0's save, hung).

The publisher also reads, once per period for the whole node, what each guard would
otherwise read from the shared file system every sample (bench/evidence.py counts it):

- whether a hang verdict names this node (`hangs/hung.<node>`, one stat): once it does,
  its marker is kept in the local directory (VERDICT), where the guards look for it;
- the progress log's new lines (a stat and the bytes appended since the last read):
  the cycles that trained and the longest save the run reported (RUN_WAITS), which a
  guard asks before a blocking native dump (rank/sampler.py).
rank/stacks.py's read_samples reads these files back into one sample per rank, so the
judgement reads what it read before. A published sample is at most one period older
than the guard's own: the judgement's freshness bound (two periods and NVRx's check
interval) allows for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nvrx_appliance import files
from nvrx_appliance.clock import now_iso
from nvrx_appliance.rank import run_waits
from nvrx_appliance.rank.flight import WAITS_DIR
from nvrx_appliance.rank.sampler import LOCAL_STACKS_ENV
from nvrx_appliance.rank.stacks import VERDICT

FLIGHT_DIR = "flight"  # rank/flight.py's flight_dir, in a cycle's node-local directory

SAMPLE_BYTES = 256 << 10  # one rank's sample, read back locally
PROGRESS_CHUNK = 4 << 20  # the most of the progress log read in one period
PROGRESS_TAIL = 256 << 10  # where the first read starts: the log's recent past

__all__ = ["LOCAL_STACKS_ENV", "Publisher", "local_dir"]


def local_dir(array_job_id: str, node: str) -> Path:
    """This node's directory for its ranks' samples: node-local, one per generation and
    node (nodes that share a machine's /tmp, as on the local cluster, do not meet)."""
    return Path(tempfile.gettempdir()) / f"nvrx-stacks-{os.getuid()}" / f"{array_job_id}.{node}"


class Publisher(threading.Thread):
    """Every `period` s, each cycle's samples of this node's ranks, as one shared file."""

    def __init__(
        self,
        local: Path,
        shared: Path,
        node: str,
        period: float,
        say: Callable[[str], None],
        *,
        hangs: Path | None = None,
        progress: Path | None = None,
        array_job_id: str = "",
    ):
        super().__init__(name="stack-publisher", daemon=True)
        self.local, self.shared, self.node, self.period, self.say = (
            local, shared, node, period, say,
        )  # fmt: skip
        self.hangs, self.progress, self.array_job_id = hangs, progress, array_job_id
        self._done = threading.Event()
        self._seen: dict[str, tuple[tuple[str, int], ...]] = {}
        self._made: set[str] = set()
        self._failed = False
        self._verdict = False  # this node's marker is kept locally
        self._read_to = -1  # how far the progress log was read (-1: not yet)
        self._partial = b""
        self._waits = run_waits.RunWaits()

    def prepare(self) -> None:
        files.make_private_dirs(self.local)

    def run(self) -> None:
        while not self._done.wait(self.period):
            self.publish()
            self.look()

    def look(self) -> None:
        """The node's one look, per period, at what its guards need from the shared file
        system: the hang marker naming this node, and the progress log's new lines."""
        with contextlib.suppress(OSError, ValueError):
            if self.hangs is not None and not self._verdict:
                marker = self.hangs / f"hung.{self.node}"
                text = files.read_text(marker, SAMPLE_BYTES) if marker.exists() else None
                if text is not None and isinstance(json.loads(text), dict):
                    files.write_atomic(self.local / VERDICT, text, 0o600, durable=False)
                    self._verdict = True
        with contextlib.suppress(OSError):
            if self.progress is not None and self._read_progress():
                body = self._waits.body(self.array_job_id)
                files.write_atomic(self.local / run_waits.FILE, body, 0o600, durable=False)

    def _read_progress(self) -> bool:
        """Read what the progress log gained since the last look; did it gain any?"""
        assert self.progress is not None
        size = self.progress.stat().st_size
        if self._read_to < 0:  # the recent past, as a guard read it: its tail
            self._read_to = max(0, size - PROGRESS_TAIL)
        if size <= self._read_to:
            return False
        with open(self.progress, "rb") as log:
            log.seek(self._read_to)
            chunk = log.read(min(size - self._read_to, PROGRESS_CHUNK))
        self._read_to += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        self._waits.add(lines, self.array_job_id)
        return True

    def publish(self) -> int:
        """Publish what changed; how many files were written to the shared directory."""
        written = 0
        try:
            cycles = sorted(n for n in os.listdir(self.local) if n.startswith("cycle"))
        except OSError:
            return 0
        for cycle in cycles:
            stamp, samples = self._read(self.local / cycle)
            waits_stamp, waits = self._read(self.local / cycle / WAITS_DIR)
            flight_stamp, flight = self._read(self.local / cycle / FLIGHT_DIR)
            stamp += waits_stamp + flight_stamp
            if not stamp or self._seen.get(cycle) == stamp:
                continue
            target = self.shared / cycle / f"{self.node}.json"
            try:
                if cycle not in self._made:
                    files.make_private_dirs(target.parent)
                    self._made.add(cycle)
                body = {"node": self.node, "time": now_iso(), "samples": samples, "waits": waits,
                        "flight": flight}  # fmt: skip
                files.write_atomic(target, json.dumps(body) + "\n", 0o600, durable=False,
                                   parent_made=True)  # fmt: skip
            except OSError as exc:
                if not self._failed:
                    self._failed = True
                    self.say(f"could not publish this node's stacks in {target}: {exc}")
                continue
            self._seen[cycle] = stamp
            written += 1
        return written

    def _read(self, directory: Path) -> tuple[tuple[tuple[str, int], ...], list[dict[str, Any]]]:
        stamp, samples = [], []
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(directory)):
                if not name.endswith(".json") or name.startswith("."):
                    continue
                with contextlib.suppress(OSError, ValueError):
                    path = directory / name
                    mtime = path.stat().st_mtime_ns
                    data = json.loads(files.read_text(path, SAMPLE_BYTES) or "")
                    if isinstance(data, dict):
                        stamp.append((name, mtime))
                        samples.append(data)
        return tuple(stamp), samples

    def stop(self) -> None:
        """Publish the last samples, then forget the node-local ones."""
        self._done.set()
        if self.is_alive():
            self.join(self.period + 5)
        self.publish()
        shutil.rmtree(self.local, ignore_errors=True)


def start(
    stacks: Path,
    array_job_id: str,
    node: str,
    period: float,
    say: Callable[[str], None],
    *,
    hangs: Path | None = None,
    progress: Path | None = None,
) -> Publisher | None:
    """This node's publisher, started, its local directory made; None when the chain
    samples no stacks or the directory cannot be made (the guards then write their own
    samples to the shared directory, as without a publisher)."""
    if period <= 0:
        return None
    publisher = Publisher(local_dir(array_job_id, node), stacks, node, period, say,
                          hangs=hangs, progress=progress, array_job_id=array_job_id)  # fmt: skip
    try:
        publisher.prepare()
    except OSError as exc:
        say(f"stacks are written per rank: no node-local directory {publisher.local}: {exc}")
        return None
    publisher.start()
    return publisher
