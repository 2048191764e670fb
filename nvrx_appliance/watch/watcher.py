"""One pass: gather a Snapshot -> detectors -> findings -> the gated action -> sinks ->
state -> heartbeat. The only module that wires the impure pieces together.

A pass never raises for what it observes: a source that fails is marked unavailable,
a sink that fails is logged, a state file that cannot be written is logged. Its result
carries the exit code: 0 clean, 1 degraded (a source could not be observed; no
heartbeat), 2 at least one critical finding.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nvrx_appliance.clock import iso_utc
from nvrx_appliance.goodput import gather, straggler
from nvrx_appliance.goodput.account import Account, account
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import workdir
from nvrx_appliance.observe.types import Checkpoint, Cycle
from nvrx_appliance.observe.workdir import NotFound
from nvrx_appliance.watch import (
    action_gate,
    detectors,
    finding_counts,
    goodput_metrics,
    persistence,
    readers,
    remember,
    sinks,
)
from nvrx_appliance.watch.config import Settings, Thresholds
from nvrx_appliance.watch.finding_counts import FindingCounts
from nvrx_appliance.watch.findings import (
    CHECKPOINT,
    CRITICAL,
    CYCLES,
    DEATHS,
    EXCLUDE_NODES,
    EXCLUSIONS,
    FOLLOW_UP,
    HANGS,
    INFO,
    LEDGER,
    MARKER,
    NOT_CONFIGURED,
    OBSERVED,
    SLURM,
    TRAINING,
    UNAVAILABLE,
    Finding,
    Run,
    Snapshot,
    SourceStatus,
)
from nvrx_appliance.watch.platform import JobInfo, NotConfigured, Platform, SlurmUnavailable
from nvrx_appliance.watch.readers import CycleReader, CycleScan, ReadError

CLEAN, DEGRADED, CRITICAL_EXIT = 0, 1, 2
ALERT_MEMORY = 7 * 24 * 3600.0  # forget sends older than a week: the state file stays small


@dataclass
class PassResult:
    snapshot: Snapshot
    findings: list[Finding]
    degraded: bool
    # The findings gauges: counted where a detector judged the pass, else carried.
    counts: FindingCounts = field(default_factory=FindingCounts)
    acted: list[str] = field(default_factory=list)  # commands run with --act
    sink_errors: list[str] = field(default_factory=list)
    heartbeat_sent: bool = False
    duration_s: float = 0.0

    @property
    def exit_code(self) -> int:
        if any(f.severity == CRITICAL for f in self.findings):
            return CRITICAL_EXIT
        return DEGRADED if self.degraded else CLEAN


class StopRequest:
    """SIGTERM and SIGINT while the watcher runs. The first lets the pass in flight finish
    (its state, metrics and heartbeat stay whole) and ends the loop after it; a second
    ends the process at once with 128 + the signal. A pass stuck in a call (a sink that
    never answers) must not swallow the TERM of `timeout`, systemd or a person."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.requested = False

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.requested:
            raise SystemExit(128 + signum)
        self.requested = True
        self.logger.warning(
            "%s: stopping after this pass (send it again to stop at once)",
            signal.Signals(signum).name,
        )


@dataclass
class Watcher:
    run: Run
    platform: Platform
    thresholds: Thresholds
    settings: Settings
    caller: str
    logger: logging.Logger
    paging: Sequence[sinks.Sink] = ()  # PagerDutySink / WebhookSink
    job_id: str = ""
    identity: JobInfo | None = (
        None  # remembered so the chain is followed after Slurm forgets the id
    )
    clock: Callable[[], float] = time.time
    blind: str = ""  # why Slurm could not even identify the job: every pass is blind
    last_scan: CycleScan | None = None  # what the last cycle-info scan read (for the bench)
    _reader: CycleReader | None = None
    _logs: gather.LogMemo = field(default_factory=gather.LogMemo)  # training logs read

    def __post_init__(self) -> None:
        self.log_sink = sinks.LogSink(self.logger, self.settings.secrets)
        self.key = persistence.chain_key(self.run.owner, self.run.job_name)
        if self.run.cycle_glob:
            self._cache_dir = persistence.cycle_cache_dir(
                self.settings.state_file, self.key, self.run.cycle_glob
            )
            cache = persistence.load_cycle_cache(self._cache_dir)
            self._reader = CycleReader(self.run.cycle_glob, cache)

    # --- gather -----------------------------------------------------------------------------

    def gather(self, state: dict[str, Any]) -> Snapshot:
        now = self.clock()
        sources: dict[str, SourceStatus] = {}
        generations, endings = self._slurm(sources)
        cycles = self._cycles(sources)
        checkpoint = self._checkpoint(sources, now, state)
        ledger, marker = self._work_dir_files(sources)
        excluded = self._excluded(sources, now)
        hangs = self._hangs(sources, cycles)
        deaths = self._deaths(sources, cycles)
        stragglers = self._stragglers(sources, cycles)
        return Snapshot(
            run=self.run,
            observed_at=now,
            caller=self.caller,
            sources=sources,
            generations=generations,
            endings=endings,
            cycles=cycles,
            checkpoint=checkpoint,
            ledger=ledger,
            chain_marker=marker,
            excluded=excluded,
            hangs=hangs,
            deaths=deaths,
            stragglers=stragglers,
        )

    def _stragglers(self, sources: dict[str, SourceStatus], cycles: tuple) -> tuple:
        """The newest cycle's stragglers, from the training record (read as it grows,
        with the goodput gauges' memo)."""
        if not self.run.work_dir:
            sources[TRAINING] = SourceStatus(NOT_CONFIGURED, "no work dir known")
            return ()
        by_generation: dict[str, list[Cycle]] = {}
        for cycle in cycles:
            by_generation.setdefault(cycle.job_id, []).append(cycle)
        try:
            work = gather.training_record(Path(self.run.work_dir), by_generation, self._logs)
        except NotFound as exc:
            sources[TRAINING] = SourceStatus(NOT_CONFIGURED, str(exc))
            return ()
        except OSError as exc:
            sources[TRAINING] = SourceStatus(UNAVAILABLE, f"the training record: {exc}")
            return ()
        sources[TRAINING] = SourceStatus(OBSERVED)
        newest = max(work.values(), key=lambda w: w.last_sign or 0.0, default=None)
        return tuple(straggler.judge(newest)) if newest is not None else ()

    def _slurm(self, sources: dict[str, SourceStatus]) -> tuple[tuple, tuple]:
        if self.blind:
            sources[SLURM] = SourceStatus(UNAVAILABLE, self.blind)
            return (), ()
        name, owner = self.run.job_name, self.run.owner
        try:
            generations = self.platform.generations(name, owner)
            endings = self.platform.endings(name, owner, self.thresholds.churn_window)
        except NotConfigured as exc:
            sources[SLURM] = SourceStatus(NOT_CONFIGURED, str(exc))
            return (), ()
        except SlurmUnavailable as exc:
            sources[SLURM] = SourceStatus(UNAVAILABLE, str(exc))
            return (), ()
        sources[SLURM] = SourceStatus(OBSERVED)
        known = {e.array_job_id for e in endings}
        unknown = [
            g.array_job_id for g in generations if g.task0 is None and g.array_job_id not in known
        ]
        try:
            endings += self.platform.task0_endings(unknown)
            sources[FOLLOW_UP] = SourceStatus(OBSERVED)
        except SlurmUnavailable as exc:  # keep what squeue and sacct said: it is sound
            sources[FOLLOW_UP] = SourceStatus(UNAVAILABLE, str(exc))
        return generations, endings

    def _cycles(self, sources: dict[str, SourceStatus]) -> tuple:
        if self._reader is None:
            sources[CYCLES] = SourceStatus(NOT_CONFIGURED, "no cycle-info location known")
            return ()
        try:
            scan = self._reader.scan()
        except ReadError as exc:
            sources[CYCLES] = SourceStatus(UNAVAILABLE, str(exc))
            return ()
        sources[CYCLES] = SourceStatus(OBSERVED)
        self.last_scan = scan
        return scan.cycles

    def _checkpoint(self, sources: dict[str, SourceStatus], now: float, state: dict) -> Checkpoint:
        if not self.run.tracker:
            sources[CHECKPOINT] = SourceStatus(NOT_CONFIGURED, "no checkpoint tracker known")
            return Checkpoint(None, None)
        try:
            checkpoint = readers.read_checkpoint(self.run.tracker)
        except ReadError as exc:
            sources[CHECKPOINT] = SourceStatus(UNAVAILABLE, str(exc))
            return Checkpoint(None, None)
        sources[CHECKPOINT] = SourceStatus(OBSERVED)
        return persistence.checkpoint_since(state, checkpoint, now)

    def _work_dir_files(self, sources: dict[str, SourceStatus]) -> tuple[tuple, bool]:
        if not self.run.work_dir:
            for source in (LEDGER, MARKER):
                sources[source] = SourceStatus(NOT_CONFIGURED, "no work dir known")
            return (), False
        layout = Layout(Path(self.run.work_dir))
        ledger: tuple = ()
        marker = False
        try:
            ledger = readers.read_ledger(str(layout.ledger))
            sources[LEDGER] = SourceStatus(OBSERVED)
        except ReadError as exc:
            sources[LEDGER] = SourceStatus(UNAVAILABLE, str(exc))
        try:
            marker = readers.marker_present(str(layout.chain_marker))
            sources[MARKER] = SourceStatus(OBSERVED)
        except ReadError as exc:
            sources[MARKER] = SourceStatus(UNAVAILABLE, str(exc))
        return ledger, marker

    def _excluded(self, sources: dict[str, SourceStatus], now: float) -> frozenset[str]:
        if not self.run.work_dir:
            sources[EXCLUSIONS] = SourceStatus(NOT_CONFIGURED, "no work dir known")
            return frozenset()
        path = str(Layout(Path(self.run.work_dir)).exclusions)
        try:
            excluded = readers.read_excluded(path, iso_utc(now) or "")
        except ReadError as exc:
            sources[EXCLUSIONS] = SourceStatus(UNAVAILABLE, str(exc))
            return frozenset()
        sources[EXCLUSIONS] = SourceStatus(OBSERVED)
        return excluded

    def _hangs(self, sources: dict[str, SourceStatus], cycles: tuple) -> tuple:
        """The hang records of the generation that wrote the newest cycle."""
        if not self.run.work_dir:
            sources[HANGS] = SourceStatus(NOT_CONFIGURED, "no work dir known")
            return ()
        sources[HANGS] = SourceStatus(OBSERVED)
        if not cycles:
            return ()
        newest = cycles[-1].job_id
        return tuple(workdir.hangs(Layout(Path(self.run.work_dir)), [newest]).get(newest, []))

    def _deaths(self, sources: dict[str, SourceStatus], cycles: tuple) -> tuple:
        """The node deaths of the generation that wrote the newest cycle."""
        if not self.run.work_dir:
            sources[DEATHS] = SourceStatus(NOT_CONFIGURED, "no work dir known")
            return ()
        sources[DEATHS] = SourceStatus(OBSERVED)
        if not cycles:
            return ()
        newest = cycles[-1].job_id
        return tuple(workdir.deaths(Layout(Path(self.run.work_dir)), [newest]).get(newest, []))

    # --- one pass -------------------------------------------------------------------------

    def pass_once(self) -> PassResult:
        started = time.monotonic()
        state_file = self.settings.state_file
        section, notes = persistence.sane_section(
            persistence.chain_section(persistence.load(state_file), self.key)
        )
        for note in notes:
            self.logger.warning("state file %s: %s", state_file, note)
        snap = self.gather(section)
        findings = detectors.run(snap, self.thresholds, self.settings.disable)
        degraded = any(s.state == UNAVAILABLE for s in snap.sources.values())
        counts = finding_counts.count(
            findings, detectors.blind_to(snap), finding_counts.from_json(section.get("findings"))
        )
        result = PassResult(snapshot=snap, findings=findings, degraded=degraded, counts=counts)
        self._act(snap, findings, result)
        for finding in findings:
            self.log_sink.send(finding, snap)
        if self.settings.dry_run:
            self._would_page(findings, section, snap.observed_at)
        else:
            alerts = self._report(snap, findings, section, result)
            self._remember(snap, section, alerts, counts, state_file)
        result.duration_s = time.monotonic() - started
        if not self.settings.dry_run:
            self._metrics(snap, result)
            self._heartbeat(result)
        self._summary(result)
        return result

    def _would_page(self, findings: list[Finding], section: dict, now: float) -> None:
        """--dry-run: what the sinks would have been sent; nothing is sent or recorded,
        so the real passes that follow page as if this one had not run."""
        prior = section.get("alerts", {})
        for sink in self.paging:
            sent = prior.get(sink.name, {})
            for finding in findings:
                if finding.severity != INFO and persistence.due(
                    sent, finding.key, now, self.settings.alert_cooldown
                ):
                    self.logger.info("dry run: would send %s to %s", finding.key, sink.name)
        self.logger.info("dry run: nothing run, paged or written (no state, metrics or heartbeat)")

    def _act(self, snap: Snapshot, findings: list[Finding], result: PassResult) -> None:
        for finding in findings:
            action = finding.action
            if action is None:
                continue
            why_not = action_gate.refusal(action, snap, self.caller)
            if why_not is not None:
                self.logger.warning("not acting on %s: %s", finding.detector, why_not)
            elif self.settings.dry_run:
                self.logger.warning("dry run (not run): %s", action.command)
            elif not self.settings.act:
                self.logger.warning("observe-only (pass --act to run it): %s", action.command)
            else:
                try:
                    if action.kind == EXCLUDE_NODES:
                        remember.exclude(action, finding, snap)
                    else:
                        self.platform.scancel(action.argv)
                    result.acted.append(action.command)
                    self.logger.warning("acted on %s: ran %s", finding.detector, action.command)
                except (SlurmUnavailable, OSError) as exc:
                    self.logger.error("action failed: %s: %s", action.command, exc)

    def _report(
        self, snap: Snapshot, findings: list[Finding], section: dict, result: PassResult
    ) -> dict[str, dict[str, float]]:
        now = snap.observed_at
        prior = section.get("alerts", {})
        alerts = {s.name: dict(prior.get(s.name, {})) for s in self.paging}
        for sink in self.paging:
            sent = alerts[sink.name]
            for finding in findings:
                if finding.severity == INFO or not persistence.due(
                    sent, finding.key, now, self.settings.alert_cooldown
                ):
                    continue
                try:
                    sink.send(finding, snap)
                    sent[finding.key] = now
                except sinks.SinkError as exc:
                    result.sink_errors.append(str(exc))
                    self.logger.error("sink %s", exc)
            self._resolve_cleared(sink, sent, snap, findings, result)
            alerts[sink.name] = persistence.prune(sent, now, ALERT_MEMORY)
        return alerts

    def _resolve_cleared(
        self, sink: sinks.Sink, sent: dict, snap: Snapshot, findings, result
    ) -> None:
        """Close what was paged and is gone, if the detector that paged it ran this pass
        on everything it consults (a missing ending hides a finding, it does not end it).
        A chain whose training completed, with nothing of it left in Slurm, has nothing
        left open: every page of it is resolved."""
        if not sink.resolves:
            return
        firing = {f.key for f in findings}
        ran = {d.name for d in detectors.ALL if detectors.complete(d, snap)}
        prefix = f"nvrx/{self.run.owner}/{self.run.job_name}/"
        for key in [k for k in sent if k.startswith(prefix) and k not in firing]:
            if key[len(prefix) :].split("/", 1)[0] not in ran and not snap.finished:
                continue
            try:
                sink.resolve(key)
                del sent[key]
            except sinks.SinkError as exc:
                result.sink_errors.append(str(exc))
                self.logger.error("sink %s", exc)

    def _remember(
        self,
        snap: Snapshot,
        section: dict,
        alerts: dict,
        counts: finding_counts.FindingCounts,
        state_file: str,
    ) -> None:
        new = {"last_pass": snap.observed_at, "alerts": alerts, "findings": counts.to_json()}
        if snap.checkpoint.value is not None:
            new["checkpoint"] = {
                "value": snap.checkpoint.value,
                "first_seen": snap.checkpoint.since,
            }
        elif "checkpoint" in section and not snap.has(CHECKPOINT):
            new["checkpoint"] = section["checkpoint"]  # blind this pass: keep the timer
        jobs = {}
        if self.job_id and self.identity is not None:
            jobs[self.job_id] = {
                "job_name": self.identity.job_name,
                "owner": self.identity.owner,
                "work_dir": self.identity.work_dir,
                "command": self.identity.command,
                "source": "state",
            }
        try:
            persistence.save_chain(state_file, self.key, new, jobs)
            if self._reader is not None and self._reader.changed:
                persistence.save_cycle_cache(
                    self._cache_dir, self._reader.cache, self._reader.changed
                )
                self._reader.changed = set()
        except OSError as exc:
            self.logger.warning("could not save watcher state (%s): %s", state_file, exc.strerror)

    def _metrics(self, snap: Snapshot, result: PassResult) -> None:
        if not self.settings.metrics_file:
            return
        figures = sinks.PassFigures(result.counts, result.duration_s, result.degraded)
        chain = {"chain": snap.run.job_name, "owner": snap.run.owner}
        text = sinks.metrics_text(snap, figures) + goodput_metrics.text(self._goodput(snap), chain)
        try:
            sinks.write_metrics(self.settings.metrics_file, text)
        except sinks.SinkError as exc:
            result.sink_errors.append(str(exc))
            self.logger.error("sink %s", exc)

    def _goodput(self, snap: Snapshot) -> Account | None:
        """The goodput account for the gauges, when the chain has a run.json (None: the
        gauges say NaN). Only with a metrics file: it costs one more sacct a pass."""
        if not self.run.work_dir:
            return None
        cycles: dict[str, list[Cycle]] = {}
        for cycle in snap.cycles:  # already read (and cached) by this pass
            cycles.setdefault(cycle.job_id, []).append(cycle)
        try:
            inputs = gather.read(
                Path(self.run.work_dir),
                lambda query: self.platform.allocations(self.run.owner, query),
                now=snap.observed_at,
                memo=self._logs,
                cycles=cycles,
            )
        except NotFound:
            return None
        return account(inputs)

    def _heartbeat(self, result: PassResult) -> None:
        if result.degraded or not self.settings.heartbeat_url:
            return  # a blind watcher must not look healthy
        try:
            sinks.heartbeat(self.settings.heartbeat_url)
            result.heartbeat_sent = True
        except sinks.SinkError as exc:
            result.sink_errors.append(str(exc))
            self.logger.error("sink %s", exc)

    def _summary(self, result: PassResult) -> None:
        snap = result.snapshot
        for name, status in snap.sources.items():
            self.logger.debug("source %s: %s%s", name, status.state,
                              f" ({status.reason})" if status.reason else "")  # fmt: skip
        skipped = [d.name for d in detectors.ALL if not detectors.runnable(d, snap)]
        self.logger.debug(
            "detectors skipped for want of a source: %s", ", ".join(skipped) or "none"
        )
        blind = [f"{n} ({s.reason})" for n, s in snap.sources.items() if s.state == UNAVAILABLE]
        running = sum(len(g.running) for g in snap.generations)
        pending = sum(len(g.pending) for g in snap.generations)
        if snap.finished and snap.completed is not None:
            self.logger.info(
                "chain %s completed training at iteration %s: nothing left to watch; remove "
                "it from cron",
                snap.run.job_name,
                snap.completed.final_iteration,
            )
        self.logger.info(
            "pass over %s (%s): %d generation(s) queued, %d task(s) running, %d pending; "
            "%d cycle(s); checkpoint %s; %d finding(s)%s; exit %d",
            snap.run.job_name,
            snap.run.owner,
            len(snap.generations),
            running,
            pending,
            len(snap.cycles),
            snap.checkpoint.value if snap.checkpoint.value is not None else "none",
            len(result.findings),
            f"; blind to {', '.join(blind)}" if blind else "",
            result.exit_code,
        )
