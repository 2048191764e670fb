"""What every `--json` output carries: which document it is, its schema version, and
times in one format (ISO 8601, UTC, 'Z'), so a script can check what it parses."""

from __future__ import annotations

import json
from typing import Any

from nvrx_appliance.clock import iso_utc

__all__ = ["SCHEMA_VERSION", "dumps", "iso_utc"]

# Raised when a field is removed or changes meaning; adding a field keeps it.
SCHEMA_VERSION = 1


def dumps(
    kind: str, body: dict[str, Any], *, strict: bool = False, version: int = SCHEMA_VERSION
) -> str:
    """`kind` names the document (status, submit, ...); the body's keys follow. `strict`:
    a NaN or an infinity is a bug to raise, never written (JSON has no such numbers, and
    strict parsers refuse Python's NaN and Infinity). `version`: a document whose own
    fields changed meaning is raised alone."""
    doc = {"schema": f"nvrx-appliance/{kind}", "schema_version": version, **body}
    return json.dumps(doc, indent=2, allow_nan=not strict)
