"""How a command of nvrx-appliance fails: one line on stderr, then its exit code.

The line names what is wrong and the fix; callers fail before they change anything,
so nothing is half done. Usage errors (a bad flag, a refused submission) exit 2, as
click's own do; a failure of the work itself exits 1. Never 93 (exitcodes.py).
"""

from __future__ import annotations

import sys
from typing import NoReturn

import click

from nvrx_appliance import exitcodes


def fail(message: str, *, prefix: str = "nvrx-appliance", code: int = exitcodes.USAGE) -> NoReturn:
    """Say `<prefix>: <message>` on stderr and exit with `code`."""
    click.echo(f"{prefix}: {message}", err=True)
    sys.exit(code)
