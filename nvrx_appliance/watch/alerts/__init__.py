"""The Prometheus alert rules for the series nvrx-watch writes (docs/watch.md, "Alert
rules"). Shipped in the wheel, so `nvrx-watch --alert-rules` finds them on a login node."""

import re
import urllib.parse
from pathlib import Path

RULES = Path(__file__).with_name("nvrx-appliance.rules.yml")
# Each runbook_url as shipped: the alert's section of the docs, relative to the project.
_RUNBOOK = re.compile(r'(runbook_url: ")(docs/watch\.md#)')


def base_problem(base: str) -> str | None:
    """Why `base` cannot be the address the docs are served at, or None."""
    parts = urllib.parse.urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"{base!r} is not an http(s) address; give e.g. https://docs.example/nvrx-appliance/"
    if parts.query or parts.fragment:
        return f"{base!r} has a query or a fragment; give the address the docs/ directory is under"
    return None


def with_runbook_base(text: str, base: str) -> str:
    """The rules with each runbook_url under `base` (where a team serves this project's
    docs/): a pager shows a relative address as a broken link."""
    prefix = base.rstrip("/") + "/"
    return _RUNBOOK.sub(lambda m: m.group(1) + prefix + m.group(2), text)
