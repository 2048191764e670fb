"""2c. The hand-off (handoff.py) again, with the appliance set up the way the seeds'
design behaves, side by side in the same run: the dead task 0's generation ends after
NVRx's store_connect_wait (300 s), as the seeds' does, where the appliance's ends on
its lease (10 s here).

In the seeds' design nothing fences a dead task 0: its peers and the cold spares the
throttle admits meanwhile dial the dead store until store_connect_wait runs out, and
the successor waits for them. The appliance cannot simply be run without a lease to
show that any more: since issue 24 a watcher whose ft_launcher gives up on task 0's
store stays until the lease decides, so "no lease" (a threshold no sample reaches)
would hold the dead generation to its time limit. So the lease is set to the seeds'
300 s, which ends the dead generation when the seeds' store wait would, and
store_connect_wait stays at 300 s for the spares. (NVRx's 60 s log-server drain does
not enter this failure: it runs on the store host, which is the node that died.) The
results table's ratio of the appliance to that design comes from this scenario's median
and the hand-off's, on identical failures.
"""

from __future__ import annotations

from bench import handoff
from bench.harness import Harness
from bench.report import Result

NAME = "seeds"
TITLE = "2c hand-off, the seeds' design"
SEEDS_WAIT_S = "300"  # NVRx's store_connect_wait in the seeds' deployment
SEEDS_LIKE = ("--lease-stale-after", SEEDS_WAIT_S, "--store-connect-wait", SEEDS_WAIT_S)


def collect(h: Harness, repeat: int, result: Result) -> None:
    handoff.run(h, repeat, result, NAME, *SEEDS_LIKE)


def finish(result: Result, floor: float | None) -> None:
    result.metrics = handoff.metrics(result.samples, floor, "node death (seeds' design)", None)
