"""The watcher's settings: detector thresholds and how one invocation behaves.

Every threshold has a name (its flag is --<name with dashes>, its environment variable
NVRX_WATCH_<NAME>), a default, and the reason for that default, printed by
`nvrx-watch --list-detectors`. The defaults assume cycles that last tens of minutes
and a checkpoint every few hundred iterations.

Pure: no I/O (the environment is passed in where it is read).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ENV_PREFIX = "NVRX_WATCH_"
HOUR = 3600.0


def _threshold(default: float | int, unit: str, why: str) -> Any:
    return field(default=default, metadata={"unit": unit, "why": why})


@dataclass(frozen=True)
class Thresholds:
    grace: float = _threshold(
        120.0,
        "s",
        "task 0's own teardown trap may still be releasing its spares; an outside "
        "observer waits this long after task 0 ended before it duplicates that work",
    )
    churn_window: float = _threshold(
        6 * HOUR,
        "s",
        "long enough to span several generations of a healthy chain, short enough that "
        "a burst of hand-offs is not diluted by a week of history",
    )
    max_generations_per_window: int = _threshold(
        3,
        "",
        "each generation ending costs a full restart from checkpoint; more than this "
        "many in the window means the chain spends its wall clock on recovery",
    )
    storm_cycles: int = _threshold(
        5,
        "",
        "a healthy generation restarts rarely; this many cycles in the storm window is "
        "a fault that recurs faster than anyone would tolerate by choice",
    )
    storm_window: float = _threshold(
        30 * 60.0,
        "s",
        "short enough that the cycles counted are one burst, not a day's isolated faults",
    )
    stall_cycles: int = _threshold(
        3,
        "",
        "NVRx's own --max-no-progress-cycles default: three completed cycles without a "
        "new checkpoint means every cycle dies before the next save",
    )
    stall_seconds: float = _threshold(
        HOUR,
        "s",
        "longer than any section timeout of a sane run (the reference deployment defaults to 10 min "
        "for setup and checkpointing), so a cycle this quiet is wedged, not slow",
    )
    budget_fraction: float = _threshold(
        0.8,
        "",
        "warn while a restart or two is still left: past --max-restarts the generation "
        "ends and the chain pays a full cross-job restart",
    )
    short_cycle_seconds: float = _threshold(
        600.0,
        "s",
        "a cycle shorter than this never reached steady training, so a node present in "
        "several of them in a row is worth a look",
    )
    suspect_cycles: int = _threshold(
        3,
        "",
        "one or two short cycles on the same node are chance on a small job; three in a "
        "row is a pattern worth naming (still correlation only)",
    )


def thresholds_fields() -> list[dataclasses.Field]:
    return list(dataclasses.fields(Thresholds))


def env_name(option: str) -> str:
    """The environment variable that stands in for a flag: --max-restarts -> NVRX_WATCH_MAX_RESTARTS."""
    return ENV_PREFIX + option.lstrip("-").replace("-", "_").upper()


@dataclass(frozen=True)
class Settings:
    """How one invocation behaves (the detectors never see these)."""

    act: bool = False  # observe-only unless the owner passes --act
    dry_run: bool = False  # decide and log only: no action, no page, no file written
    disable: frozenset[str] = frozenset()
    alert_cooldown: float = HOUR  # re-page a condition that persists this long
    command_timeout: float = 30.0  # per Slurm command: a hung slurmctld must not hang cron
    state_file: str = ""
    metrics_file: str = ""  # Prometheus textfile for node_exporter; empty: none
    pagerduty_url: str = ""  # empty: no PagerDuty sink (no routing key)
    pagerduty_routing_key: str = ""  # secret: from env or a file, never argv
    webhook_url: str = ""  # secret: Slack-style URLs carry a token
    heartbeat_url: str = ""  # secret for the same reason

    @property
    def secrets(self) -> tuple[str, ...]:
        return tuple(
            s for s in (self.pagerduty_routing_key, self.webhook_url, self.heartbeat_url) if s
        )


# --- coming from the reference watcher ----------------------------------------------------

# The reference watcher (NVRx's examples/fault_tolerance/deployment/watch) reads
# NVRX_WATCH_<FIELD> for each field of its config. The fields that are not an option
# here, by field name: each is honoured under our name or refused, never ignored
# (paging would just stop). The rest share our names (docs/migrating.md).
PAGERDUTY_KEY_ENV = "NVRX_WATCH_PAGERDUTY_ROUTING_KEY"
REFERENCE_RENAMED = {"pd_routing_key": PAGERDUTY_KEY_ENV}
NO_RESTART_EXIT_CODE = "93"
_TRUE = ("1", "true", "yes", "on")  # how the reference reads a boolean


def _reference_refusal(key: str, raw: str | None, name: str) -> str | None:
    """Why the reference's `key` (set to `raw`, as `name`) cannot be taken here; None
    when it says what nvrx-watch does anyway (raw None: a config key, always refused)."""
    shown = name if raw is None else f"{name}={raw!r}"
    if key == "observe_only":
        if raw is not None and raw.strip().lower() in _TRUE:
            return None
        return f"{shown}: observe-only is the default here; act with --act (act = true)"
    if key == "no_restart_exit_code":
        if raw is not None and raw.strip() == NO_RESTART_EXIT_CODE:
            return None
        return (
            f"{shown}: ft_launcher says 'do not restart' with 93 unless told "
            "otherwise (the reference's sbatch never tells it), and chain_not_cancelled "
            "looks for 93; drop it"
        )
    if key == "expect_file":
        return (
            f"{name}: the chain marker here is <work dir>/chain.active, which submit "
            "writes; for a chain submit_chain.sh queued, watch it with --work-dir "
            "<its NVRX_WORK_DIR> and create chain.active there; drop it"
        )
    return None


REFERENCE_ONLY = ("pd_routing_key", "observe_only", "no_restart_exit_code", "expect_file")


def reference_environment(
    environ: Mapping[str, str], known: Iterable[str]
) -> tuple[dict[str, str], list[str], list[str]]:
    """(the environment with the reference's names read under ours, notices, refusals).

    `known`: the NVRX_WATCH_* variables nvrx-watch reads. Any other NVRX_WATCH_* name is
    refused too: a misspelt or foreign one would otherwise be ignored in silence.
    """
    env, notices, refusals = dict(environ), [], []
    for key in REFERENCE_ONLY:
        name = ENV_PREFIX + key.upper()
        if name not in environ:
            continue
        raw = environ[name]
        ours = REFERENCE_RENAMED.get(key)
        if ours and environ.get(ours, raw) != raw:
            refusals.append(
                f"{name} and {ours} disagree; {name} is the reference watcher's name for "
                f"{ours}: unset one of them"
            )
        elif ours:
            env[ours] = raw
            notices.append(f"{name} read as {ours}; the reference watcher's name")
        elif refusal := _reference_refusal(key, raw, name):
            refusals.append(refusal)
        else:
            notices.append(f"{name}={raw.strip()} is what nvrx-watch does anyway")
    own = set(known) | {ENV_PREFIX + k.upper() for k in REFERENCE_ONLY}
    for name in sorted(n for n in environ if n.startswith(ENV_PREFIX) and n not in own):
        refusals.append(f"{name} is not an nvrx-watch setting; see nvrx-watch --help")
    return env, notices, refusals


def reference_key_refusal(key: str) -> str | None:
    """Why a --config key the reference watcher's config had is refused here, or None
    for a key the reference did not have."""
    if key in REFERENCE_RENAMED:
        return f"{key}: a secret never goes in a config file here; set {REFERENCE_RENAMED[key]}"
    if key in REFERENCE_ONLY:
        return _reference_refusal(key, None, key)
    return None


def parse_disable(raw: str, known: list[str]) -> frozenset[str]:
    """--disable a,b: unknown names are an error naming the valid ones."""
    names = frozenset(n.strip() for n in raw.split(",") if n.strip())
    unknown = sorted(names - set(known))
    if unknown:
        raise ValueError(
            f"unknown detector(s) {', '.join(unknown)}; choose from {', '.join(known)}"
        )
    return names
