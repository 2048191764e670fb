"""14. `plan` at any scale (issue 46): how long each input that once never returned, or
returned nan, now takes to answer or be refused. No cluster: the command in this
process (click's runner, as a person's shell would run it less the interpreter start),
each input `repeat` times; a sample is one invocation's wall time.
"""

from __future__ import annotations

import time

from click.testing import CliRunner

from bench.harness import Harness
from bench.report import Metric, Result
from nvrx_appliance.cli.main import cli

NAME = "planinputs"
TITLE = "14 plan at any scale"
# Each answers within ANSWER_S or is refused (exit 2) naming the option.
ANSWER_S = 2.0
# (what it is, the arguments, the exit status it must end with)
INPUTS = (
    ("262k GPUs, week-long generations", ("--nodes", "32768", "--time", "7-00:00:00"), 0),
    ("1.84M GPUs", ("--nodes", "230000"), 0),
    (
        "16k GPUs, 400 node deaths per 1,000 node-days",
        ("--nodes", "2048", "--node-death", "400"),
        0,
    ),
    ("10M GPUs", ("--nodes", "1250000"), 0),
    ("rank crashes 1e308 (refused)", ("--rank-crash", "1e308"), 2),
    # Today's --time and the partition's most alike: the plan keeps 1 s generations.
    ("1 s generations", ("--time", "00:00:01", "--max-time", "00:00:01"), 0),
    ("worker_start=inf (refused)", ("--cost", "worker_start=inf"), 2),
    ("queue wait inf (refused)", ("--queue-wait", "inf"), 2),
    ("no time limit (--time 0)", ("--time", "0"), 0),
    ("the defaults: 16k GPUs, 90 days", (), 0),
)


def _once(args: tuple[str, ...], status: int) -> float:
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["plan", *args])
    took = time.monotonic() - started
    if result.exit_code != status:
        raise RuntimeError(f"plan {' '.join(args)}: exit {result.exit_code}, not {status}: "
                           f"{result.output[-400:]}")  # fmt: skip
    return took


def collect(h: Harness | None, repeat: int, result: Result) -> None:
    for _ in range(repeat):
        result.samples.append({label: _once(args, status) for label, args, status in INPUTS})
    result.notes.append(
        f"each input answered (or was refused, exit 2) within {ANSWER_S:g} s is the target; "
        "one sample is one invocation in this process, the interpreter's start not counted"
    )


def finish(result: Result, floor: float | None) -> None:
    result.metrics = [
        Metric(f"plan: {label}", [s[label] for s in result.samples if label in s], ANSWER_S)
        for label, _, _ in INPUTS
    ]
