"""Times as Slurm, NVRx and the ledger write them, and ages as a person reads them. Pure."""

from __future__ import annotations

from datetime import datetime, timezone

_UNKNOWN_TIMES = {"", "unknown", "none", "n/a"}


def parse_time(text: str | None) -> float | None:
    """ISO-8601 (NVRx writes UTC with 'Z') or Slurm's zone-less local time -> epoch seconds."""
    if not text or text.strip().lower() in _UNKNOWN_TIMES:
        return None
    value = text.strip()
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def sacct_since(iso_utc: str) -> str:
    """run.json's UTC time as the local time `sacct --starttime` expects."""
    try:
        moment = datetime.fromisoformat(iso_utc.replace("Z", "+00:00"))
    except ValueError:
        return "now-30days"
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def age_text(seconds: float) -> str:
    if seconds < 90:
        return f"{int(seconds)}s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
