"""The workload guard: each rank's workload runs under it, between ft_launcher and the
workload, so that the training's own verdicts reach the chain.

ft_launcher knows a worker's exit code and nothing else: every failure is restarted in
place, on the same GPUs, until NVRx's budget runs out and it exits 93. So a checkpoint
that cannot be loaded, or Megatron's "result validation failed" (17), loops until NVRx
ends the chain as if it had judged the machines. NVRx 0.7.0 offers no hook on a worker's
exit code (launcher.py `_invoke_run_with_any_failed_policy` restarts on any failure), so
the guard sits where the code is known, one process per rank:

    ft_launcher -> guard -> workload (the same process group: torch elastic's signals,
                                      the save signal and a final SIGKILL reach both)

It copies the workload's output through unchanged, keeping its last lines, and when the
workload exits it asks workload_exit.judge what the exit means:

- a checkpoint that could not be loaded: set aside, the tracker pointed at the one
  before (fallback.py), and the worker exits as it would have: NVRx's next cycle loads
  the earlier checkpoint. Past the chain's bound: a stop-chain verdict.
- a verdict (the exit table's resume-elsewhere or stop-chain): the verdict file goes to
  the generation's control directory, and the guard holds, without exiting, so that
  ft_launcher sees no failure and starts no cycle. Every entrypoint's supervisor finds
  the file and stops its ft_launcher; task 0's teardown acts on it.
- anything else: exit with the workload's code, as without the guard.

Each cycle's first failure is recorded (Layout.exit_records) for the teardown's
account ("failed 4 times at iteration 60 with exit 1") and for node memory, which must
never blame a node for the workload. The exit code is always the workload's own: the
guard adds no code of its own (93 is never one).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from nvrx_appliance import files
from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.checkpoints import fallback
from nvrx_appliance.clock import now_iso
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import run_files
from nvrx_appliance.rank import flight, kill_cause, sampler, stacks, stillness, workload_exit
from nvrx_appliance.settings import exit_actions

MODULE = "nvrx_appliance.rank.guard"
TAIL_LINES = 200  # what is kept of the workload's output, per stream
LOAD_LINES = 20  # and of its lines about loading a checkpoint
MAX_PARTIAL = 8192  # a line longer than this is judged in pieces
CHUNK = 65536
# The words a line about a checkpoint holds (workload_exit.is_load_line), as bytes.
_CHECKPOINT_WORD = b"checkpoint"
_LOAD_FAILED_MARK = workload_exit.LOAD_FAILED_MARK.encode()
# After a verdict, how long the guard holds before exiting anyway. Task 0 reads the
# control directory every second and stops everything; a node that looks rarely is
# cancelled by the relay within seconds of that. This only bounds a supervisor gone.
HOLD_S = 300.0
DRAIN_S = 5.0  # after the workload exits, for what its children still write
VERDICT_ITERATION = "verdict_iteration.json"  # in the exit records


def argv(control: Path, exits: Path, generation: str, workload: Sequence[str]) -> list[str]:
    """What ft_launcher runs on each rank: the guard, then the workload's own argv."""
    return [
        sys.executable, "-m", MODULE, "--control", str(control), "--exits", str(exits),
        "--generation", generation, "--", *workload,
    ]  # fmt: skip


def say(line: str) -> None:
    print(f"{now_iso()} nvrx-guard: {line}", file=sys.stderr, flush=True)


class _Tee:
    """Copies one of the workload's streams to ours, unchanged, keeping its last lines.

    Every line of a rank passes here, so the common one costs what a substring test
    costs: lines are kept as bytes (decoded only when the worker has exited), numbered
    by a counter both streams share (the order in which they arrived, for the
    judgement), and a line is asked whether it is about a checkpoint only when its chunk
    names one."""

    def __init__(self, source: int, target: int, order: Iterator[int]):
        self.lines: collections.deque[tuple[bytes, int]] = collections.deque(maxlen=TAIL_LINES)
        # What the workload said about loading a checkpoint, however much follows it.
        self.load_lines: collections.deque[tuple[bytes, int]] = collections.deque(maxlen=LOAD_LINES)
        self._order = order
        self._partial = b""
        self._source, self._target = source, target
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while chunk := _read(self._source):
            _write_all(self._target, chunk)
            self._keep(chunk)
        if self._partial:
            self.lines.extend(zip([self._partial], self._order, strict=False))
        os.close(self._source)

    def _keep(self, chunk: bytes) -> None:
        data = self._partial + chunk
        *whole, self._partial = data.split(b"\n")
        numbered = list(
            zip(whole, self._order, strict=False)
        )  # whole first: no number drawn in vain
        self.lines.extend(numbered)
        if _CHECKPOINT_WORD in data or _LOAD_FAILED_MARK in data:
            for raw, n in numbered:
                if workload_exit.is_load_line(raw.decode("utf-8", "replace")):
                    self.load_lines.append((raw, n))
        if len(self._partial) > MAX_PARTIAL:
            self.lines.extend(zip([self._partial], self._order, strict=False))
            self._partial = b""


def said(tees: Sequence[_Tee]) -> list[str]:
    """What the workload wrote that the tees kept, in the order it arrived, each once."""
    kept = {n: raw for tee in tees for raw, n in (*tee.load_lines, *tee.lines)}
    return [kept[n].decode("utf-8", "replace") for n in sorted(kept)]


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, CHUNK)
    except OSError:
        return b""


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):  # our stream closed: the workload's must still drain
        while data:
            data = data[os.write(fd, data) :]


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class Guard:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.stopping = threading.Event()  # torch elastic's TERM (or INT) reached us
        self.hang: dict[str, str] | None = None  # the verdict of the hang that ended it

    def run(self) -> int:
        workload = self.args.workload
        for signum in (signal.SIGTERM, signal.SIGINT):
            # The group signal reached the workload too: nothing to forward, only note
            # that a failure from now on is a stop, not a verdict.
            signal.signal(signum, lambda *_: self.stopping.set())
        # The checkpoint the workload is about to load: a failed load that names none is
        # this one (the tracker may have moved by then: another rank's fall-back).
        self.tracked_at_start = _tracked()
        oom_before = kill_cause.oom_kills()  # a SIGKILL the OOM killer sent is no hang
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            # Traceable by the guard's children (py-spy) under Yama's ptrace_scope 1; its
            # environment switches on the flight-recorder watch (rank/flight.py).
            child = subprocess.Popen(
                workload, stdout=out_w, stderr=err_w,
                env=flight.child_env(os.environ, self.args.generation),
                preexec_fn=sampler.traceable_by(os.getpid()),
            )  # fmt: skip
        except OSError as exc:
            say(f"cannot start the workload {workload[0]}: {exc}")
            return 127
        finally:
            os.close(out_w)
            os.close(err_w)
        order = itertools.count()
        tees = (
            _Tee(out_r, sys.stdout.fileno(), order),
            _Tee(err_r, sys.stderr.fileno(), order),
        )
        # Its stack, sampled; when NVRx's timeout kills it, the cycle's hang is judged.
        stack_watch = stacks.watch(self.args.generation, child.pid, say)
        # A script that never connects to NVRx's rank monitor: its out-of-section timeout.
        still = stillness.watch(
            self.args.generation, child.pid, stack_watch.sampler if stack_watch else None, say
        )
        if stack_watch is not None:
            # torch elastic's TERM stops the workers: no sample then proves a move
            stack_watch.stopping = self.stopping
        code = _wait(child)
        # Whether the worker was stopped, as it exited: a TERM that comes while its output
        # drains (torch elastic stopping the group after this failure) stops nothing the
        # worker did, and a failed load seen only in rank 0's window must still be judged.
        stopped = self.stopping.is_set() or (code == stacks.KILLED and self.for_a_dead_node())
        if still is not None:
            still.close()
        if stack_watch is not None:
            not_hang = code == stacks.KILLED and self.not_a_hang(oom_before)
            watchdog = None
            if code == kill_cause.ABORTED:  # NCCL's watchdog says so in its last lines
                for tee in tees:
                    tee.thread.join(DRAIN_S)
                watchdog = kill_cause.nccl_watchdog(said(tees))
            if stack_watch.after_exit(code, stopping=stopped or bool(not_hang), watchdog=watchdog):
                # Where the hang's verdict accounts for this kill, node memory never counts
                # it as the node's failure (stacks.explains_kill)
                self.hang = stack_watch.verdict()
        for tee in tees:
            tee.thread.join(DRAIN_S)
        if stopped:
            return code
        try:
            return self.judge(code, said(tees))
        except Exception as exc:  # the exit code is always the workload's own
            say(f"could not judge exit {code} ({exc!r}): it passes through as it is")
            return code

    def _where(self) -> tuple[Layout, str, str] | None:
        """The run's layout, this generation's array job id and this rank's Slurm node;
        None without a run manifest."""
        try:
            manifest = run_manifest.load(Path(os.environ["NVRX_RUN_MANIFEST"]))
        except (KeyError, run_manifest.ManifestError):
            return None
        parts = self.args.generation.split("/")
        node = os.environ.get("SLURMD_NODENAME") or self.who()["node"]
        return manifest.layout, parts[1] if len(parts) > 2 else "", node

    def for_a_dead_node(self) -> bool:
        """Task 0 ended these ranks because another node died silently (said)."""
        where = self._where()
        if where is None:
            return False
        layout, array_job_id, node = where
        why = kill_cause.for_a_dead_node(
            layout.deaths(array_job_id), node, self.args.generation,
            os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
        )  # fmt: skip
        if why:
            say(why)
        return why is not None

    def not_a_hang(self, oom_before: int | None) -> str | None:
        """Why the workload's SIGKILL was not a hang's timeout (said), or None."""
        where = self._where()
        if where is None:
            return None
        layout, array_job_id, node = where
        why = kill_cause.not_a_hang(
            oom_before=oom_before, oom_now=kill_cause.oom_kills(),
            stragglers=layout.stragglers(array_job_id), node=node,
            generation=self.args.generation,
        )  # fmt: skip
        if why:
            say(why)
        return why

    def judge(self, code: int, lines: list[str]) -> int:
        try:
            manifest = run_manifest.load(Path(os.environ["NVRX_RUN_MANIFEST"]))
        except (KeyError, run_manifest.ManifestError) as exc:
            if code != 0:
                say(f"cannot judge exit {code}: no run manifest ({exc})")
            return code
        spec, policy = manifest.spec, manifest.policy
        # Megatron prints its loading lines on global rank 0 only (workload_exit says why
        # that rank decides); a worker outside torch elastic is its own rank 0.
        rank0 = os.environ.get("RANK", "0") == "0"
        seen = workload_exit.judge(code, policy.exit_actions, spec.workload, lines,
                                   rank0=rank0, tracked=self.tracked_at_start)  # fmt: skip
        if seen is None:
            return code
        action = seen.action
        words = workload_exit.describe(seen)
        failure = seen.load_failure
        bad = None if failure is None else failure.iteration
        if failure is not None and bad is None:
            bad = self.tracked_at_start
        if failure is not None and bad is None:
            say(f"a checkpoint failed to load ({failure.line}), but which one is unknown: "
                "nothing set aside")  # fmt: skip
        elif failure is not None:
            layout = manifest.layout
            outcome = fallback.set_aside(
                layout.checkpoints, layout.fallbacks, bad, chain=manifest.chain_id,
                limit=policy.checkpoint_fallbacks, floor=manifest.checkpoint_start,
                who=self.who(), reason=failure.line,
            )  # fmt: skip
            say(outcome.message)
            action = exit_actions.STOP_CHAIN if outcome.stop else exit_actions.RESTART
            words = outcome.message
        self.record(seen, action, words)
        if action in (exit_actions.RESUME_ELSEWHERE, exit_actions.STOP_CHAIN):
            self.give_verdict(seen, action, words)
            return self.hold(code)
        if self.verdict_given():
            return self.hold(code)  # another rank's verdict stands: start no cycle
        return code

    def who(self) -> dict[str, str]:
        return {
            "generation": self.args.generation,
            "node": socket.gethostname().split(".", 1)[0],
            "rank": os.environ.get("RANK", ""),
            "cycle": os.environ.get("TORCHELASTIC_RESTART_COUNT", ""),
        }

    def account(self, seen: workload_exit.Exit, action: str, words: str) -> dict:
        return {
            **self.who(), "code": seen.code, "action": action, "meaning": seen.meaning,
            "iteration": seen.iteration, "line": seen.line, "words": words,
            "load_failed": seen.load_failure is not None, "time": now_iso(),
            "epoch": time.time(), **({"hang": self.hang} if self.hang else {}),
        }  # fmt: skip

    def record(self, seen: workload_exit.Exit, action: str, words: str) -> None:
        """This node's first failed worker of the cycle. A worker that dies takes its
        peers' collectives down with it a moment later: the teardown and node memory
        take each cycle's earliest account as its cause, the others as consequences."""
        cycle = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        node = self.who()["node"]
        exits = Path(self.args.exits)
        with contextlib.suppress(OSError):
            exits.mkdir(mode=0o700, parents=True, exist_ok=True)
            _create(exits / f"cycle{int(cycle) if cycle.isdecimal() else 0}.{node}.json",
                    self.account(seen, action, words))  # fmt: skip
            if action in (exit_actions.RESUME_ELSEWHERE, exit_actions.STOP_CHAIN):
                # The nodes whose workers gave the verdict: resume-elsewhere keeps the
                # next generation off them.
                (exits / "verdict_nodes").mkdir(mode=0o700, exist_ok=True)
                (exits / "verdict_nodes" / node).touch(mode=0o600)
                if seen.iteration is not None:
                    # The verdict's iteration, from the first of its workers that named
                    # one: Megatron names it on one rank, and the verdict file is
                    # another's as often as not (the teardown reads both).
                    _create(exits / VERDICT_ITERATION, self.account(seen, action, words))

    def give_verdict(self, seen: workload_exit.Exit, action: str, words: str) -> None:
        path = Path(self.args.control) / "verdict"
        try:
            if _create(path, self.account(seen, action, words)):
                say(f"the workload's verdict ({action}): {words}")
        except OSError as exc:
            say(f"could not write the verdict {path}: {exc}")

    def verdict_given(self) -> bool:
        try:
            text = (Path(self.args.control) / "verdict").read_text()
            return json.loads(text).get("generation") == self.args.generation
        except (OSError, ValueError, AttributeError):
            return False

    def hold(self, code: int) -> int:
        """Hold the worker's place until the supervisor stops ft_launcher (its TERM), so
        that NVRx sees no failure and starts no cycle; then exit as the workload did."""
        self.stopping.wait(HOLD_S)
        return code


def _tracked() -> int | None:
    """The tracker's iteration now, from the run manifest's work dir; None if unknown."""
    try:
        manifest = run_manifest.load(Path(os.environ["NVRX_RUN_MANIFEST"]))
        text = files.read_text(manifest.layout.tracker, 64)
    except (KeyError, OSError, run_manifest.ManifestError):
        return None
    return run_files.tracker_value(text or "")


def _wait(child: subprocess.Popen) -> int:
    while True:
        try:
            return _exit_code(child.wait())
        except InterruptedError:  # pragma: no cover - PEP 475 retries; belt and braces
            time.sleep(0.01)


_create = files.create_once


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvrx-guard")
    parser.add_argument("--control", required=True)
    parser.add_argument("--exits", required=True)
    parser.add_argument("--generation", required=True)
    parser.add_argument("workload", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.workload[:1] == ["--"]:
        args.workload = args.workload[1:]
    if not args.workload:
        parser.error("no workload to run after --")
    return Guard(args).run()


if __name__ == "__main__":
    sys.exit(main())
