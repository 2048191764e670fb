"""How a command of nvrx-appliance fails: one line on stderr, then its exit code.

The line names what is wrong and the fix; callers fail before they change anything,
so nothing is half done. Usage errors (a bad flag, a refused submission) exit 2, as
click's own do; a failure of the work itself exits 1. Never 93 (exitcodes.py).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from typing import NoReturn

import click

from nvrx_appliance import api, exitcodes


def fail(message: str, *, prefix: str = "nvrx-appliance", code: int = exitcodes.USAGE) -> NoReturn:
    """Say `<prefix>: <message>` on stderr and exit with `code`."""
    click.echo(f"{prefix}: {message}", err=True)
    sys.exit(code)


def refused(problems: Sequence[str], *, prefix: str) -> NoReturn:
    """A submission refused before anything was written (api.SettingsError): one line
    per problem, then what that means, exit 2. submit, qualify and the demo say it alike."""
    for problem in problems:
        click.echo(f"{prefix}: {problem}", err=True)
    fail("nothing was written or submitted", prefix=prefix)


@contextlib.contextmanager
def submit_failures(prefix: str) -> Iterator[None]:
    """How a command that queues a chain (submit, qualify, demo) ends when api.submit
    does not: refused exits 2, interrupted 128 + the signal (130 for Ctrl-C, as a shell
    reports it), failed 1; one line each, what was rolled back included."""
    try:
        yield
    except api.SettingsError as exc:
        refused(exc.problems, prefix=prefix)
    except api.SubmitInterrupted as exc:
        fail(str(exc), prefix=prefix, code=128 + exc.signum)
    except api.SubmitFailed as exc:
        fail(str(exc), prefix=prefix, code=1)
