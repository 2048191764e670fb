"""The guard's stack sampler: the workload's last stack, kept where the judgement reads it.

The guard is its workload's parent, so it may read the workload's memory (ptrace rules:
a parent, the same user, no root). Every `stack_sampling` seconds it runs
`py-spy dump --nonblocking --json` on the workload (about 8 ms of one core, measured:
docs/hangs.md) and keeps the last stack in the generation's work dir:

    nvrx/<array job id>/stacks/cycle<N>/<node>.rank<R>.json     (owner-only)

--nonblocking reads without stopping the workload, so it also reads a rank that is
itself stopped (SIGSTOP, state T) where the blocking mode fails. rank/stacks.py reads
the samples back and judges a hang from them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nvrx_appliance import files
from nvrx_appliance.clock import now_iso

SAMPLE_VERSION = 1
PYSPY_TIMEOUT_S = 10.0  # a dump takes ~8 ms; one that takes this long is given up
MAX_FRAMES = 64  # innermost frames kept per stack
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# A rank that used less than this share of one core between two alike samples is blocked.
QUIET_SHARE = 0.1


def pyspy() -> str | None:
    """py-spy beside this Python (the image's venv), else on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def main_thread_frames(dump: Any, pid: int) -> list[dict[str, Any]] | None:
    """The workload's main thread (its os thread id is the pid) from py-spy's JSON, as
    [{name, file, line}] innermost first; None when it is not there."""
    if not isinstance(dump, list):
        return None
    for thread in dump:
        if isinstance(thread, dict) and thread.get("os_thread_id") == pid:
            return [
                {
                    "name": str(f.get("name", "")),
                    "file": str(f.get("short_filename") or f.get("filename") or ""),
                    "line": int(f.get("line") or 0),
                }
                for f in thread.get("frames") or []
                if isinstance(f, dict)
            ][:MAX_FRAMES]
    return None


def proc_state(pid: int) -> tuple[str, int]:
    """(state letter, CPU ticks used) from /proc; ("", 0) when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "", 0
    fields = text.rsplit(")", 1)[-1].split()
    try:
        return fields[0], int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return "", 0


class Sampler:
    """A thread that keeps the workload's last stack in `path`, every `period` s."""

    def __init__(
        self,
        pid: int,
        path: Path,
        period: float,
        who: dict[str, Any],
        say: Callable[[str], None],
        on_sample: Callable[[dict[str, Any]], None] | None = None,
    ):
        self.pid, self.path, self.period, self.who, self.say = pid, path, period, who, say
        self.on_sample = on_sample
        self.stop = threading.Event()
        self.last: dict[str, Any] | None = None
        self.binary = pyspy()
        self.thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    def start(self) -> None:
        if self.binary is None:
            self.say("no stacks sampled: py-spy is not installed (a hang names no node)")
            return
        try:
            files.make_private_dirs(self.path.parent)
        except OSError as exc:
            self.say(f"no stacks sampled: {self.path.parent}: {exc}")
            return
        self.thread.start()

    def _run(self) -> None:
        failures = 0
        while not self.stop.wait(self.period if self.last is not None else 1.0):
            sample = self.take()
            if sample is None:
                failures += 1
                if failures == 3:
                    self.say("py-spy could not read the workload's stack 3 times in a row")
                continue
            failures = 0
            self.last = sample
            try:
                files.write_atomic(self.path, json.dumps(sample) + "\n", 0o600, durable=False)
            except OSError as exc:
                self.say(f"could not keep the workload's stack in {self.path}: {exc}")
            if self.on_sample is not None:
                self.on_sample(sample)

    def dump(self, *how: str) -> list[dict[str, Any]] | None:
        """The main thread's frames by one py-spy dump; None when it could not read them."""
        assert self.binary is not None
        try:
            done = subprocess.run(
                [self.binary, "dump", *how, "--json", "--pid", str(self.pid)],
                capture_output=True, text=True, timeout=PYSPY_TIMEOUT_S, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0 or self.stop.is_set():
            return None  # the workload ended meanwhile: its last stack stands
        try:
            return main_thread_frames(json.loads(done.stdout), self.pid)
        except ValueError:
            return None

    def take(self) -> dict[str, Any] | None:
        frames = self.dump("--nonblocking")
        if frames is None:
            return None
        state, ticks = proc_state(self.pid)
        now = time.time()
        last = self.last if self.last is not None and self.last["frames"] == frames else None
        sample = {
            **self.who,
            "version": SAMPLE_VERSION,
            "pid": self.pid,
            "time": now_iso(),
            "epoch": now,
            "frames": frames,
            "still_since": last["still_since"] if last else now,
            "state": state,
            "cpu_ticks": ticks,
            "native": last.get("native", []) if last else [],
            "native_at": last.get("native_at") if last else None,
        }
        if last is not None and self.blocked(last, sample):
            # A rank that waits in C++ (DDP's gradient all-reduce runs inside backward)
            # shows only its Python caller: its native frames say what it waits for.
            # Blocking mode pauses the rank for ~0.5 s, so only a blocked one, once.
            native = self.dump("--native")
            if native is not None:
                sample["native"] = [f["name"] for f in native][:MAX_FRAMES]
                sample["native_at"] = now
        return sample

    def blocked(self, last: dict[str, Any], sample: dict[str, Any]) -> bool:
        """The same stack as last time, asleep (not stopped: a stopped rank cannot be read
        natively), hardly any CPU since, and no native frames of this stillness yet."""
        quiet = (sample["cpu_ticks"] - last["cpu_ticks"]) <= QUIET_SHARE * self.period * CLOCK_TICKS
        asleep = sample["state"] in ("S", "D")
        return asleep and quiet and not sample["native"]

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(PYSPY_TIMEOUT_S)
