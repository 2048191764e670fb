"""One way to write a moment: ISO 8601 in UTC, to the second, with 'Z'.

run.json's chain id, the ledger, the control files, the qualification record, the image
manifest and every `--json` document use it, so a time written by one side compares
equal and sorts right against the same time written by another. (The teardown runs
without this package and writes the same form itself.)
"""

from __future__ import annotations

import datetime

FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime(FORMAT)


def iso_utc(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc).strftime(FORMAT)
