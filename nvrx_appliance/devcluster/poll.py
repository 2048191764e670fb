"""Waiting for a condition with a deadline: the only way the cluster (and its tests) wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Timeout(TimeoutError):
    """The condition did not hold before the deadline; the message says what was awaited."""


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll `predicate` until it returns something truthy, and return that.

    Raises Timeout naming `what` when `timeout` seconds pass first. The predicate may
    raise to stop the wait early (a daemon that died will not become ready).
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise Timeout(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
