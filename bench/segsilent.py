"""5c. Segment mode again (segment.py), but the node dies silently: `kill-node --silent`
takes its link down before its processes die, so no reset reaches its peers, as after a
power loss or a dead NIC. The survivors block in the step's all-reduce until NVRx's
step-section timeout (30 s in the quick settings; 180 s by default) ends them: that is
the detection a silent death costs, and the rest is as in 5b.
"""

from __future__ import annotations

from bench import segment
from bench.harness import Harness
from bench.report import Result

NAME = "segsilent"
TITLE = "5c segment mode: another task's node goes silent"


def collect(h: Harness, repeat: int, result: Result) -> None:
    segment.collect(h, repeat, result, silent=True)


def finish(result: Result, floor: float | None) -> None:
    segment.finish(result, floor, "silent node death")
