"""The imperative shell around the watcher: its settings and secrets from the options
nvrx-watch was given, the logger and the paging sinks, the identity of the chain, and
the loop of passes. cli/watch.py is its command line.

Every flag can also be set as NVRX_WATCH_<FLAG> (e.g. NVRX_WATCH_WORK_DIR); --work-dir
and --job-name then fall back to NVRX_WORK_DIR and NVRX_JOB_NAME, the names
`nvrx-appliance submit` reads (and the reference deployment set). Secrets are never
flags: the PagerDuty routing key, the webhook URL and the heartbeat URL come from
NVRX_WATCH_PAGERDUTY_ROUTING_KEY / NVRX_WATCH_WEBHOOK_URL / NVRX_WATCH_HEARTBEAT_URL, or
from a file named by a --...-file flag.
"""

from __future__ import annotations

import logging
import os
import pwd
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from nvrx_appliance import files
from nvrx_appliance.watch import detectors, persistence, sinks, target
from nvrx_appliance.watch.config import PAGERDUTY_KEY_ENV, Settings, parse_disable
from nvrx_appliance.watch.findings import Run
from nvrx_appliance.watch.platform import NullPlatform, Platform, SlurmPlatform, SlurmUnavailable
from nvrx_appliance.watch.watcher import DEGRADED, StopRequest, Watcher

PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
SECRETS = {
    "pagerduty_routing_key": PAGERDUTY_KEY_ENV,
    "webhook_url": "NVRX_WATCH_WEBHOOK_URL",
    "heartbeat_url": "NVRX_WATCH_HEARTBEAT_URL",
}


def _dashed(name: str) -> str:
    return name.replace("_", "-")


def settings_from(
    options: dict[str, Any], warn: Callable[[str], None], environ: Mapping[str, str]
) -> Settings:
    """The watcher's settings from its options (flags, NVRX_WATCH_* or a --config file,
    as click resolved them) and its secrets (from `environ`, with the reference
    watcher's names read under ours). Raises ValueError naming the option."""
    secrets = {name: _secret(name, options, warn, environ) for name in SECRETS}
    urls = {
        "webhook URL": (secrets["webhook_url"], "NVRX_WATCH_WEBHOOK_URL or --webhook-url-file"),
        "heartbeat URL": (
            secrets["heartbeat_url"],
            "NVRX_WATCH_HEARTBEAT_URL or --heartbeat-url-file",
        ),
        "PagerDuty URL": (options["pagerduty_url"], "--pagerduty-url"),
    }
    for what, (url, source) in urls.items():
        problem = url and sinks.url_problem(url)
        if problem:  # the URL itself stays out of the message: it may carry a token
            raise ValueError(f"the {what} ({source}) {problem}; fix it")
    metrics = options["metrics_file"]
    if metrics and not metrics.endswith(".prom"):
        # node_exporter's textfile collector reads *.prom only: any other name is never scraped.
        raise ValueError(
            f"--metrics-file {metrics}: node_exporter's textfile collector reads only "
            "files named *.prom; name it so"
        )
    plain = options["pagerduty_url"].startswith("http://")
    if plain and secrets["pagerduty_routing_key"] and not options["pagerduty_allow_http"]:
        raise ValueError(
            "--pagerduty-url is plain http, so the routing key would cross the network in "
            "clear; use https, or --pagerduty-allow-http for a local relay"
        )
    if options["state_file"] and options["state_dir"]:
        raise ValueError("--state-file and --state-dir both place the state; give one")
    state_file = options["state_file"] or (
        os.path.join(options["state_dir"], "state.json")
        if options["state_dir"]
        else persistence.default_state_file()
    )
    return Settings(
        act=options["act"],
        dry_run=options["dry_run"],
        disable=parse_disable(options["disable"], detectors.NAMES),
        alert_cooldown=options["alert_cooldown"],
        command_timeout=options["command_timeout"],
        state_file=state_file,
        metrics_file=options["metrics_file"],
        pagerduty_url=options["pagerduty_url"],
        **secrets,
    )


def _secret(
    name: str, options: dict[str, Any], warn: Callable[[str], None], environ: Mapping[str, str]
) -> str:
    """From its environment variable, else from the file its --...-file flag names."""
    value = environ.get(SECRETS[name], "").strip()
    path = options.get(f"{name}_file", "")
    if value or not path:
        return value
    flag = f"--{_dashed(name)}-file"
    try:
        value = (files.read_text(path, 64 << 10) or "").strip()  # bounded, never blocking
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ValueError(f"{flag}: cannot read {path}: {exc.strerror}") from None
    if not value:
        # An empty key would turn paging off without a word.
        raise ValueError(f"{flag}: {path} is empty; put the secret in it, or drop the flag")
    if mode & 0o077:
        warn(f"{flag}: {path} is open to other users (mode {mode & 0o777:04o}); chmod 600 it")
    return value


def make_logger(log_file: str, verbose: bool = False) -> logging.Logger:
    logger = logging.getLogger("nvrx_watch")
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    formatter = logging.Formatter("%(asctime)s nvrx-watch %(levelname)s %(message)s")
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    for handler in handlers:
        handler.setFormatter(formatter)
        logger.addHandler(handler)
    return logger


def caller_name() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def _paging(settings: Settings, job_id: str) -> list:
    paging: list = []
    if settings.pagerduty_routing_key and settings.pagerduty_url:
        paging.append(
            sinks.PagerDutySink(settings.pagerduty_url, settings.pagerduty_routing_key, job_id)
        )
    if settings.webhook_url:
        paging.append(sinks.WebhookSink(settings.webhook_url))
    return paging


def build(request, settings, thresholds, logger) -> Watcher:
    """Identify the job and locate the run; a watcher that is blind when Slurm cannot say
    whose job it is (the pass then pages that, and exits 1)."""
    caller = caller_name()
    platform: Platform = (
        NullPlatform()
        if request.platform == "none"
        else SlurmPlatform(timeout=settings.command_timeout)
    )
    known = persistence.load(settings.state_file).get("jobs", {})
    common = dict(
        thresholds=thresholds,
        settings=settings,
        caller=caller,
        logger=logger,
        paging=_paging(settings, request.job_id),
    )
    try:
        info = target.identify(request, platform, caller, known)
    except SlurmUnavailable as exc:
        placeholder = Run(job_name=request.job_name or f"job-{request.job_id}", owner=caller)
        return Watcher(run=placeholder, platform=platform, blind=str(exc), **common)
    run, notes = target.locate(request, info)
    for note in notes:
        logger.warning("%s", note)
    logger.info("%s", watching(run, slurm=request.platform != "none"))
    return Watcher(run=run, platform=platform, job_id=request.job_id, identity=info, **common)


def watching(run: Run, slurm: bool) -> str:
    """What this watcher looks at, said once at start: the paths it will read and where
    they came from, so a wrong glob shows up in the first line, not as silence."""
    where = "through Slurm" if slurm else "without Slurm (--platform none: chain detectors off)"
    return (
        f"watching chain {run.job_name} of {run.owner} {where}; "
        f"cycle infos: {run.cycle_glob or 'none'}; checkpoint tracker: {run.tracker or 'none'}; "
        f"work dir: {run.work_dir or 'none'}; from {run.origin or 'nowhere (chain detectors only)'}"
    )


def loop(request, settings, thresholds, logger, interval: int) -> int:
    """One pass, or a pass every `interval` seconds until TERM or INT (a second one ends
    even a pass stuck in a call); the last pass's exit code. Raises target.ResolveError
    when the request names no chain."""
    stop = StopRequest(logger)
    stop.install()
    watcher: Watcher | None = None
    code = DEGRADED
    while not stop.requested:
        if watcher is None or watcher.blind:
            watcher = build(request, settings, thresholds, logger)
        code = watcher.pass_once().exit_code
        if not interval:
            return code
        deadline = time.monotonic() + interval
        while not stop.requested and time.monotonic() < deadline:
            time.sleep(min(1.0, deadline - time.monotonic()))
    return code
