"""One help style for the three commands (nvrx-appliance, nvrx-watch, nvrx-entrypoint).

click writes what it knows about an option as `[env var: X; default: Y]`; options that
resolve their own environment and defaults (submit's, through resolve.py) write the
same words through `extra`, so a reader sees one format everywhere.
"""

from __future__ import annotations

# -h as well as --help, and lines wide enough for the long option names.
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def extra(*, env: str | None, default: str) -> str:
    """The bracket click appends to an option's help, for an option that shows its own."""
    parts = ([f"env var: {env}"] if env else []) + [f"default: {default}"]
    return f"[{'; '.join(parts)}]"
