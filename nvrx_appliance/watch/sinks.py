"""Where findings go: the log (always), PagerDuty Events v2, a JSON webhook
(Slack-compatible), a Prometheus textfile for node_exporter, and the dead-man heartbeat.

Reporting must not share fate with observation: these talk HTTP, not Slurm, so a blind
watcher can still page. A sink that fails raises SinkError with one line; the pass
logs it and carries on with the next sink. Secrets (the routing key, webhook and
heartbeat URLs, which carry tokens) never appear in an error message: every message is
redacted against them.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import re
import shlex
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nvrx_appliance import __version__
from nvrx_appliance.files import write_atomic
from nvrx_appliance.jsondoc import iso_utc
from nvrx_appliance.watch.finding_counts import FindingCounts
from nvrx_appliance.watch.findings import NOT_CONFIGURED, OBSERVED, TRAINING, Finding, Snapshot

HTTP_TIMEOUT_S = 10.0  # a paging service slower than this is down for our purposes
USER_AGENT = f"nvrx-watch/{__version__}"


class SinkError(Exception):
    """A sink could not deliver; the message is one line and holds no secret."""


# A piece of a secret URL shorter than this is an ordinary word ("services", "ping"):
# redacting it everywhere would garble messages without hiding a token.
MIN_TOKEN_PIECE = 10


def secret_pieces(secret: str) -> set[str]:
    """The secret, and for a URL each part that may carry its token: an error can quote a
    part alone (urllib quotes the port it could not parse, 'TOKEN@host'; a library the
    path). The scheme and the host name stay readable: they say which service failed."""
    pieces = {secret}
    if "://" not in secret:
        return pieces
    try:
        split = urllib.parse.urlsplit(secret)
        host, password = split.hostname or "", split.password or ""
    except ValueError:
        return pieces
    userinfo = split.netloc.rpartition("@")[0]
    pieces |= {userinfo, password, split.path, split.query, split.fragment}
    pieces |= {p for p in re.split(r"[/?&=#:@;]", secret) if len(p) >= MIN_TOKEN_PIECE}
    return {p for p in pieces if p.strip("/") and p != host}


def redact(text: str, secrets: Iterable[str]) -> str:
    pieces = set().union(*(secret_pieces(s) for s in secrets if s))
    for piece in sorted(pieces, key=len, reverse=True):  # the whole before its parts
        text = text.replace(piece, "***")
    return text


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a sink's address, or None. Says nothing of the URL itself:
    it may carry a token."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return "contains a blank or a control character"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        return "is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "is not an http(s)://host/... URL"
    if "@" in parts.netloc:
        # urllib cannot send them: they end up parsed as the port, and quoted in errors.
        return (
            "holds a user name or password before the host (user:token@host), which "
            "nvrx-watch cannot send; use the service's URL that carries its token in the "
            "path or query"
        )
    return None


def _post_json(url: str, body: dict, what: str, secrets: Sequence[str]) -> None:
    headers = {"Content-Type": "application/json"}
    _send(url, what, secrets, data=json.dumps(body).encode(), headers=headers)


def _send(
    url: str,
    what: str,
    secrets: Sequence[str],
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    try:
        # Inside the try: a URL that passed the start-up check can still be refused here
        # (urllib is stricter than urlsplit), and that must be a redacted sink error.
        request = urllib.request.Request(
            url,
            data=data,
            headers={"User-Agent": USER_AGENT, **(headers or {})},
            method="POST" if data is not None else "GET",
        )
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            response.read(4096)
    except urllib.error.HTTPError as exc:
        raise SinkError(redact(f"{what}: HTTP {exc.code} {exc.reason}", secrets)) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SinkError(redact(f"{what}: unreachable ({reason})", secrets)) from None
    except http.client.InvalidURL as exc:  # an HTTPException, not a ValueError
        raise SinkError(redact(f"{what}: unusable URL ({exc})", secrets)) from None
    except http.client.HTTPException as exc:  # a reply that is not HTTP, a dropped one
        kind = type(exc).__name__
        raise SinkError(redact(f"{what}: bad reply ({kind}: {exc})", secrets)) from None
    except ValueError as exc:
        raise SinkError(redact(f"{what}: unusable URL ({exc})", secrets)) from None


def line(finding: Finding) -> str:
    """How a finding reads in the log: severity, detector, what, then what to do."""
    text = f"[{finding.severity}] {finding.detector}: {finding.summary}"
    return f"{text}. {finding.detail}" if finding.detail else text


class Sink(Protocol):
    """Where a finding is paged. `resolves` says whether it can close a page once its
    condition is gone (PagerDuty can; a posted webhook message cannot be taken back)."""

    name: str
    resolves: bool

    def send(self, finding: Finding, snap: Snapshot) -> None: ...

    def resolve(self, key: str) -> None: ...


class LogSink:
    name = "log"

    def __init__(self, logger: logging.Logger, secrets: Sequence[str] = ()) -> None:
        self.logger = logger
        self.secrets = tuple(secrets)

    def send(self, finding: Finding, snap: Snapshot) -> None:
        level = {"info": logging.INFO, "warning": logging.WARNING}.get(
            finding.severity, logging.ERROR
        )
        self.logger.log(level, redact(line(finding), self.secrets))


DEDUP_KEY_LIMIT = 255  # PagerDuty Events v2 refuses a longer dedup_key


def pagerduty_dedup_key(key: str) -> str:
    """The finding's key, or for one past PagerDuty's limit (a long chain or owner name)
    its head and a digest of the whole: the same on every pass and every login node, so
    a trigger and its resolve still meet."""
    if len(key) <= DEDUP_KEY_LIMIT:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{key[: DEDUP_KEY_LIMIT - len(digest) - 1]}~{digest}"


def status_command(snap: Snapshot, job_id: str) -> str:
    """What the person paged runs first: the chain's status, by the id being watched."""
    if job_id:
        return f"nvrx-appliance status {job_id}"
    command = f"nvrx-appliance status {shlex.quote(snap.run.job_name)}"
    work_dir = snap.run.work_dir
    return f"{command} --work-dir {shlex.quote(work_dir)}" if work_dir else command


class PagerDutySink:
    """Events API v2: one trigger per finding, deduplicated by the finding's key; a
    resolve once the condition is gone."""

    name = "pagerduty"
    resolves = True

    def __init__(self, url: str, routing_key: str, job_id: str = "") -> None:
        self.url = url
        self.routing_key = routing_key
        self.job_id = job_id  # the id the watcher was given, for the status command

    def send(self, finding: Finding, snap: Snapshot) -> None:
        details = {
            "detail": finding.detail,
            "work_dir": snap.run.work_dir,
            "status": status_command(snap, self.job_id),
        }
        if finding.action is not None:
            details["command"] = finding.action.command
        body = {
            "routing_key": self.routing_key,
            "event_action": "trigger",
            "dedup_key": pagerduty_dedup_key(finding.key),
            "client": USER_AGENT,
            "payload": {
                "summary": finding.summary[:1024],
                "source": f"{snap.run.owner}/{snap.run.job_name}",
                "severity": finding.severity,
                "timestamp": iso_utc(snap.observed_at),
                "component": snap.run.job_name,
                "group": snap.run.owner,
                "class": finding.detector,
                "custom_details": details,
            },
        }
        _post_json(self.url, body, "pagerduty", (self.routing_key,))

    def resolve(self, key: str) -> None:
        body = {
            "routing_key": self.routing_key,
            "event_action": "resolve",
            "dedup_key": pagerduty_dedup_key(key),
        }
        _post_json(self.url, body, "pagerduty", (self.routing_key,))


class WebhookSink:
    """A JSON POST whose `text` a Slack incoming webhook shows as is; the structured
    finding rides along for any other receiver."""

    name = "webhook"
    resolves = False

    def __init__(self, url: str) -> None:
        self.url = url

    def resolve(self, key: str) -> None:
        """Nothing to close: what was posted stays posted."""

    def send(self, finding: Finding, snap: Snapshot) -> None:
        body = {
            "text": f"nvrx-watch {line(finding)}",
            "finding": {
                "key": finding.key,
                "detector": finding.detector,
                "severity": finding.severity,
                "summary": finding.summary,
                "detail": finding.detail,
                "command": finding.action.command if finding.action else None,
                "chain": snap.run.job_name,
                "owner": snap.run.owner,
            },
        }
        _post_json(self.url, body, "webhook", (self.url,))


def heartbeat(url: str) -> None:
    """Ping the dead-man switch: only after a pass that could observe."""
    _send(url, "heartbeat", (url,))


# --- Prometheus textfile ---------------------------------------------------------------------


@dataclass(frozen=True)
class PassFigures:
    counts: FindingCounts  # the findings gauges: counted, or carried through blindness
    duration_s: float
    degraded: bool


def _labels(**labels: str) -> str:
    def esc(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


def _number(value: float | None) -> str:
    if value is None:
        return "NaN"  # no value yet: the series stays, so a graph or alert never loses it
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _generation_number(job_id: str) -> float | None:
    return float(job_id) if job_id.isdigit() else None


Samples = Iterable[tuple[dict[str, str], float | None]]


def gauge(name: str, help_text: str, samples: Samples, chain: dict[str, str]) -> list[str]:
    """One gauge's lines of the textfile: its help, its type, a sample per label set."""
    return [
        f"# HELP {name} {help_text}",
        f"# TYPE {name} gauge",
        *(f"{name}{_labels(**chain, **labels)} {_number(value)}" for labels, value in samples),
    ]


def metrics_text(snap: Snapshot, figures: PassFigures) -> str:
    """One textfile per pass. The set of series is the same on every pass of a chain
    (but for nvrx_watch_node_findings, a series per node a finding names):
    a count that is zero is written as 0 and a value not known yet as NaN, never left
    out (an absent series reads as "no data", not "none"); and no label holds a job id,
    so a chain of a thousand generations still has one series per metric, with the
    current generation as a value (nvrx_watch_current_generation)."""
    chain = {"chain": snap.run.job_name, "owner": snap.run.owner}
    out: list[str] = []

    def metric(name: str, help_text: str, samples: Samples) -> None:
        out.extend(gauge(name, help_text, samples, chain))

    counts = figures.counts
    metric(
        "nvrx_watch_findings",
        "Findings of the last pass that judged each detector, by detector and severity "
        "(0: none). A detector skipped for want of a source keeps its last count (no "
        "sample before it ever had one): blindness is not health.",
        [({"detector": d, "severity": s}, n) for (d, s), n in sorted(counts.by_detector.items())],
    )
    metric(
        "nvrx_watch_node_findings",
        "Findings that name a node, by detector and node, as nvrx_watch_findings counts "
        "them. A node's series exists only while a finding names it: the alert rules take "
        "the node's name from it.",
        [({"detector": d, "node": n}, count) for (d, n), count in sorted(counts.by_node.items())],
    )
    metric(
        "nvrx_watch_source_up",
        "1 if the source was observed in the last pass, 0 if not.",
        [
            ({"source": name}, float(s.state == OBSERVED))
            for name, s in snap.sources.items()
            if s.state != NOT_CONFIGURED
        ],
    )
    metric(
        "nvrx_watch_spares",
        "Hot and cold spares the chain was submitted with (NaN: unknown without run.json). "
        "NvrxSparesExhausted fires only for a chain that had some.",
        [({}, snap.run.spares)],
    )
    states = {"running": 0, "pending": 0}
    for gen in snap.generations:
        states["running"] += len(gen.running)
        states["pending"] += len(gen.pending)
    metric(
        "nvrx_watch_generations",
        "Generations of the chain in the queue.",
        [({}, len(snap.generations))],
    )
    metric(
        "nvrx_watch_tasks",
        "Array tasks of the chain in the queue, by state.",
        [({"state": k}, v) for k, v in states.items()],
    )
    metric("nvrx_watch_cycles", "NVRx cycles recorded for the run.", [({}, len(snap.cycles))])
    latest = snap.latest_cycle
    metric(
        "nvrx_watch_current_generation",
        "Array job id of the generation that wrote the newest NVRx cycle (NaN: none yet).",
        [({}, _generation_number(latest.job_id) if latest else None)],
    )
    metric(
        "nvrx_watch_current_cycle",
        "Number of the newest NVRx cycle (NaN: none yet).",
        [({}, latest.number if latest else None)],
    )
    slowest = snap.stragglers[0] if snap.stragglers else None
    measured = snap.has(TRAINING)
    metric(
        "nvrx_watch_straggler_slowdown",
        "The slowest straggler's own step time over its peers' in the newest cycle "
        "(0: none named; NaN: the training record not read). Its node is in the finding.",
        [({}, slowest.slowdown if slowest else (0.0 if measured else None))],
    )
    metric(
        "nvrx_watch_straggler_lost_seconds",
        "Wall seconds the newest cycle has lost waiting for its slowest straggler (0: none).",
        [({}, slowest.lost_s if slowest else (0.0 if measured else None))],
    )
    checkpoint = snap.checkpoint
    metric(
        "nvrx_watch_checkpoint_iteration",
        "The checkpoint tracker's iteration (NaN: no checkpoint yet).",
        [({}, checkpoint.value)],
    )
    since = (checkpoint.since or checkpoint.mtime) if checkpoint.value is not None else None
    metric(
        "nvrx_watch_checkpoint_age_seconds",
        "Seconds since the checkpoint iteration last moved (NaN: no checkpoint yet).",
        [({}, max(0.0, snap.observed_at - since) if since is not None else None)],
    )
    metric(
        "nvrx_watch_degraded",
        "1 if the last pass could not observe a source.",
        [({}, float(figures.degraded))],
    )
    metric(
        "nvrx_watch_pass_duration_seconds", "Duration of the last pass.", [({}, figures.duration_s)]
    )
    metric(
        "nvrx_watch_last_pass_timestamp_seconds",
        "When the last pass observed.",
        [({}, snap.observed_at)],
    )
    return "\n".join(out) + "\n"


def write_metrics(path: str, text: str) -> None:
    """node_exporter reads the directory at any moment: rename into place, never write in it."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(Path(path), text, 0o644, durable=False)
    except OSError as exc:
        raise SinkError(f"metrics textfile {path}: {exc.strerror}") from None
