"""Where findings go: the log (always), PagerDuty Events v2, a JSON webhook
(Slack-compatible), a Prometheus textfile for node_exporter, and the dead-man heartbeat.

Reporting must not share fate with observation: these talk HTTP, not Slurm, so a blind
watcher can still page. A sink that fails raises SinkError with one line; the runner
logs it and carries on with the next sink. Secrets (the routing key, webhook and
heartbeat URLs, which carry tokens) never appear in an error message: every message is
redacted against them.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvrx_appliance import __version__
from nvrx_appliance.files import write_atomic
from nvrx_appliance.watch.types import NOT_CONFIGURED, OBSERVED, Finding, Snapshot

HTTP_TIMEOUT_S = 10.0  # a paging service slower than this is down for our purposes
USER_AGENT = f"nvrx-watch/{__version__}"


class SinkError(Exception):
    """A sink could not deliver; the message is one line and holds no secret."""


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
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
    except ValueError as exc:
        raise SinkError(redact(f"{what}: unusable URL ({exc})", secrets)) from None


def line(finding: Finding) -> str:
    """How a finding reads in the log: severity, detector, what, then what to do."""
    text = f"[{finding.severity}] {finding.detector}: {finding.summary}"
    return f"{text}. {finding.detail}" if finding.detail else text


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


class PagerDutySink:
    """Events API v2: one trigger per finding, deduplicated by the finding's key; a
    resolve once the condition is gone."""

    name = "pagerduty"

    def __init__(self, url: str, routing_key: str) -> None:
        self.url = url
        self.routing_key = routing_key

    def send(self, finding: Finding, snap: Snapshot) -> None:
        details = {"detail": finding.detail, "work_dir": snap.run.work_dir}
        if finding.action is not None:
            details["command"] = finding.action.command
        body = {
            "routing_key": self.routing_key,
            "event_action": "trigger",
            "dedup_key": finding.key,
            "client": USER_AGENT,
            "payload": {
                "summary": finding.summary[:1024],
                "source": f"{snap.run.owner}/{snap.run.job_name}",
                "severity": finding.severity,
                "component": snap.run.job_name,
                "group": snap.run.owner,
                "class": finding.detector,
                "custom_details": details,
            },
        }
        _post_json(self.url, body, "pagerduty", (self.routing_key,))

    def resolve(self, key: str) -> None:
        body = {"routing_key": self.routing_key, "event_action": "resolve", "dedup_key": key}
        _post_json(self.url, body, "pagerduty", (self.routing_key,))


class WebhookSink:
    """A JSON POST whose `text` a Slack incoming webhook shows as is; the structured
    finding rides along for any other receiver."""

    name = "webhook"

    def __init__(self, url: str) -> None:
        self.url = url

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
    findings: Sequence[Finding]
    duration_s: float
    degraded: bool


def _labels(**labels: str) -> str:
    def esc(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def metrics_text(snap: Snapshot, figures: PassFigures) -> str:
    chain = {"chain": snap.run.job_name, "owner": snap.run.owner}
    out: list[str] = []

    def metric(name: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} gauge")
        out.extend(
            f"{name}{_labels(**chain, **labels)} {_number(value)}" for labels, value in samples
        )

    by_kind: dict[tuple[str, str], int] = {}
    for f in figures.findings:
        by_kind[(f.detector, f.severity)] = by_kind.get((f.detector, f.severity), 0) + 1
    metric(
        "nvrx_watch_findings",
        "Findings of the last pass, by detector and severity.",
        [({"detector": d, "severity": s}, n) for (d, s), n in sorted(by_kind.items())],
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
    if snap.latest_cycle is not None:
        metric(
            "nvrx_watch_current_cycle",
            "Number of the newest NVRx cycle.",
            [({"generation": snap.latest_cycle.job_id}, snap.latest_cycle.number)],
        )
    if snap.checkpoint.value is not None:
        metric(
            "nvrx_watch_checkpoint_iteration",
            "The checkpoint tracker's iteration.",
            [({}, snap.checkpoint.value)],
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
