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
docs/stragglers.md). Written by rename, only when a sample or a figure changed: O(1) per node per period, whatever the ranks.
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
from nvrx_appliance.rank.flight import WAITS_DIR
from nvrx_appliance.rank.sampler import LOCAL_STACKS_ENV

SAMPLE_BYTES = 256 << 10  # one rank's sample, read back locally

__all__ = ["LOCAL_STACKS_ENV", "Publisher", "local_dir"]


def local_dir(array_job_id: str, node: str) -> Path:
    """This node's directory for its ranks' samples: node-local, one per generation and
    node (nodes that share a machine's /tmp, as on the local cluster, do not meet)."""
    return Path(tempfile.gettempdir()) / f"nvrx-stacks-{os.getuid()}" / f"{array_job_id}.{node}"


class Publisher(threading.Thread):
    """Every `period` s, each cycle's samples of this node's ranks, as one shared file."""

    def __init__(
        self, local: Path, shared: Path, node: str, period: float, say: Callable[[str], None]
    ):
        super().__init__(name="stack-publisher", daemon=True)
        self.local, self.shared, self.node, self.period, self.say = (
            local, shared, node, period, say,
        )  # fmt: skip
        self._done = threading.Event()
        self._seen: dict[str, tuple[tuple[str, int], ...]] = {}
        self._made: set[str] = set()
        self._failed = False

    def prepare(self) -> None:
        files.make_private_dirs(self.local)

    def run(self) -> None:
        while not self._done.wait(self.period):
            self.publish()

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
            stamp += waits_stamp
            if not stamp or self._seen.get(cycle) == stamp:
                continue
            target = self.shared / cycle / f"{self.node}.json"
            try:
                if cycle not in self._made:
                    files.make_private_dirs(target.parent)
                    self._made.add(cycle)
                body = {"node": self.node, "time": now_iso(), "samples": samples, "waits": waits}
                files.write_atomic(target, json.dumps(body) + "\n", 0o600, durable=False)
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
    stacks: Path, array_job_id: str, node: str, period: float, say: Callable[[str], None]
) -> Publisher | None:
    """This node's publisher, started, its local directory made; None when the chain
    samples no stacks or the directory cannot be made (the guards then write their own
    samples to the shared directory, as without a publisher)."""
    if period <= 0:
        return None
    publisher = Publisher(local_dir(array_job_id, node), stacks, node, period, say)
    try:
        publisher.prepare()
    except OSError as exc:
        say(f"stacks are written per rank: no node-local directory {publisher.local}: {exc}")
        return None
    publisher.start()
    return publisher
