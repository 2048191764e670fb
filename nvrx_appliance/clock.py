"""Two ways to write a moment, both ISO 8601 in UTC with 'Z'.

To the second (`now_iso`, `iso_utc`): run.json's chain id, the ledger, the control files,
the qualification record, the image manifest and every `--json` document, so a time
written by one side compares equal and sorts right against the same time written by
another. (The teardown runs without this package and writes the same form itself.)

To the millisecond (`log_stamp`): the first word of every line the appliance writes into
a job's output (the entrypoint's, the CPU trainer's; the job-host scripts write the same
form themselves), e.g. `2026-12-03T07:21:32.123Z`. Lines of several nodes and of
NVRx then sort together by time, and a hand-off of a few seconds can be read off them.
"""

from __future__ import annotations

import datetime
import time

FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime(FORMAT)


def iso_utc(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc).strftime(FORMAT)


def log_stamp(epoch: float | None = None) -> str:
    """`epoch` (default: now) as a log line's timestamp: 2026-12-03T07:21:32.123Z."""
    moment = time.time() if epoch is None else epoch
    # Truncated, not rounded: a stamp never names a millisecond that has not begun.
    millis = int(moment * 1000)
    whole = datetime.datetime.fromtimestamp(millis // 1000, tz=datetime.timezone.utc)
    return f"{whole.strftime('%Y-%m-%dT%H:%M:%S')}.{millis % 1000:03d}Z"
