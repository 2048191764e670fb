"""2c. The hand-off (handoff.py) again, with the appliance set up the way the seeds'
design behaves, side by side in the same run: no lease (a threshold no sample reaches),
so nothing fences a dead task 0, and NVRx's store_connect_wait at its 300 s. The peers
then dial the dead store until it runs out, and the successor waits for them. (NVRx's
60 s log-server drain does not enter this failure: it runs on the store host, which
is the node that died.) The results table's ratio of the appliance to that design comes from
this scenario's median and the hand-off's, on identical failures.
"""

from __future__ import annotations

from bench import handoff
from bench.harness import Harness
from bench.report import Result

NAME = "seeds"
TITLE = "2c hand-off, the seeds' design"
SEEDS_LIKE = ("--lease-stale-after", "100000", "--store-connect-wait", "300")


def collect(h: Harness, repeat: int, result: Result) -> None:
    handoff.run(h, repeat, result, NAME, *SEEDS_LIKE)


def finish(result: Result, floor: float | None) -> None:
    result.metrics = handoff.metrics(result.samples, floor, "node death (seeds' design)", None)
