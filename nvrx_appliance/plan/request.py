"""What a person asks `plan` for, checked before anything runs, and the scenario it
makes. Pure: a problem names the option and the fix."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from nvrx_appliance.plan import costs as priced
from nvrx_appliance.plan import profiles
from nvrx_appliance.plan.history import ChainHistory
from nvrx_appliance.plan.rates import RATE_FIELDS, Rates
from nvrx_appliance.plan.simulate import Scenario, Settings

# Llama 3's largest per-GPU checkpoint state (arXiv 2407.21783: 1 MB to 4 GB per GPU)
# and its storage's sustained throughput (Tectonic, 2 TB/s): the default checkpoint.
CHECKPOINT_GB_PER_GPU = 4.0
STORAGE_GBPS = 2000.0
# GPFS's failure detection is 35 s by default: the stall a live task 0 must ride out
# (settings/chain.py, lease_stale_after's reason).
STORAGE_STALL_S = 40.0
MOST_SEEDS = 1000


@dataclass(frozen=True)
class Request:
    nodes: int = 2048
    gpus_per_node: int = 8
    nodes_per_task: int = 1
    segment: int = 0
    days: float = 90.0
    time_limit_s: float = 3600.0  # today's, submit's default --time (01:00:00)
    # The longest time limit the partition allows (its MaxTime): the recommendation.
    most_time_s: float = 24 * 3600.0
    rates: Rates = field(default_factory=Rates)
    checkpoint_gb: float | None = None  # None: CHECKPOINT_GB_PER_GPU per GPU, assumed
    storage_gbps: float | None = None  # None: STORAGE_GBPS, assumed
    save_s: float | None = None
    load_s: float | None = None
    queue_wait_s: float = 0.0
    response_s: float = 3600.0
    storage_stall_s: float = STORAGE_STALL_S
    # Today's settings: the appliance's defaults (settings/chain.py), a 30-minute interval.
    today: Settings = field(default_factory=lambda: Settings(1800.0, 1, 0, 46.0, 3))
    grace_s: float = 3.0
    step_s: float | None = None
    overrides: dict[str, float] = field(default_factory=dict)
    profile: str = profiles.DEFAULT
    # Today's detection settings (submit's): a hang costs the step timeout, a silent
    # node death the appliance's silence timeout and a beat.
    step_timeout_s: float = priced.DEFAULT_STEP_TIMEOUT_S
    node_silence_s: float = priced.DEFAULT_NODE_SILENCE_S
    seeds: int = 10
    # The rates were given (--node-death ...): with --from-chain they stand, and the
    # chain gives only its costs (what it measured) and its step.
    rates_given: bool = False
    # The waits a person gave rather than left to the plan's assumptions: "queue_wait",
    # "response".
    given: frozenset[str] = frozenset()


# Upper bounds: past them a figure is a typo, and it would only slow the answer.
# Ten thousand interruptions a node a day, one every 9 s: above the local benchmarks'
# injected failures (row 11: one every 20 s on 4 nodes, about a million), millions of
# times Llama 3's 3.8.
MOST_RATE = 1e7
MOST_NODES = 10_000_000
# A month: no recovery step, wait or save of a run that trains takes longer.
MOST_SECONDS = 30 * 86400.0
MOST_CHECKPOINT_GB = 1e9  # an exabyte
MOST_STORAGE_GBPS = 1e6  # a petabyte a second
LEAST_STORAGE_GBPS = 1e-3  # a megabyte a second: below it, a typo
# A millisecond: no training step of a run this plans is shorter, and the save interval
# in iterations (tau / step) stays a number a person can type.
LEAST_STEP_S = 1e-3
MOST_SPARES = 1_000_000
MOST_DEPTH = 100_000


def _within(value: float, low: float, high: float, *, above: bool = False) -> bool:
    """Finite (inf and nan are no figure), at most `high`, at least (`above`: over) `low`."""
    if not math.isfinite(value):
        return False
    return (value > low if above else value >= low) and value <= high


def shown(value: float) -> str:
    """A value as the person typed it, near enough: 0, 2048, 1e-300, inf, nan."""
    return str(value) if isinstance(value, int) else f"{value:g}"


def problems(request: Request) -> list[str]:
    """Every bad value, each with the option that holds it, the value given and what to
    pass instead."""
    out = []

    def need(ok: bool, option: str, given: str, fix: str) -> None:
        if not ok:
            out.append(f"{option} {given}: {fix}")

    def seconds(
        value: float | None,
        option: str,
        what: str,
        *,
        above: bool = False,
        low: float = 0.0,
        unit: float = 1.0,  # the option's unit in seconds, to show the value as given
        given: str | None = None,
    ) -> None:
        if value is not None:
            floor = f"at least {low:g}" if low else ("above 0" if above else "0 or more")
            need(
                _within(value, low, MOST_SECONDS, above=above and not low),
                option,
                given or shown(value / unit),
                f"{what}, {floor} and at most {MOST_SECONDS / unit:,.0f} (30 days)",
            )

    r, t = request, request.today
    need(
        1 <= r.nodes <= MOST_NODES,
        "--nodes",
        shown(r.nodes),
        f"the nodes that train, 1 to {MOST_NODES:,} (e.g. --nodes 2048)",
    )
    need(
        1 <= r.gpus_per_node <= 1024,
        "--gpus-per-node",
        shown(r.gpus_per_node),
        "1 to 1,024 (8 on an HGX node)",
    )
    need(
        1 <= r.nodes_per_task <= r.nodes,
        "--nodes-per-task",
        shown(r.nodes_per_task),
        f"between 1 and --nodes ({r.nodes})",
    )
    need(
        0 <= r.segment <= r.nodes,
        "--segment",
        shown(r.segment),
        f"0 (off) or the nodes of one NVLink domain, at most --nodes ({r.nodes})",
    )
    need(
        _within(r.days, 0, 3650, above=True),
        "--days",
        shown(r.days),
        "the run's length in days, above 0 and at most 3,650 (e.g. --days 90)",
    )
    for option, limit in (("--time", r.time_limit_s), ("--max-time", r.most_time_s)):
        need(
            limit > 0 and not math.isnan(limit),
            option,
            shown(limit),
            "a Slurm time limit, 0 or UNLIMITED for none (e.g. 1-00:00:00)",
        )
    for name in RATE_FIELDS:
        need(
            _within(getattr(r.rates, name), 0, MOST_RATE),
            f"--{name.replace('_', '-')}",
            shown(getattr(r.rates, name)),
            f"interruptions per 1,000 node-days, 0 to {MOST_RATE:,.0f} (Llama 3's, all "
            "causes: 3.8)",
        )
    need(
        _within(r.rates.unloadable, 0, 1) and r.rates.unloadable < 1,
        "--unloadable",
        shown(r.rates.unloadable),
        "a share of loads, from 0 up to below 1",
    )
    need(
        r.checkpoint_gb is None or _within(r.checkpoint_gb, 0, MOST_CHECKPOINT_GB),
        "--checkpoint-gb",
        shown(r.checkpoint_gb or 0.0),
        f"0 to {MOST_CHECKPOINT_GB:,.0f} GB",
    )
    need(
        r.storage_gbps is None or _within(r.storage_gbps, LEAST_STORAGE_GBPS, MOST_STORAGE_GBPS),
        "--storage-gbps",
        shown(r.storage_gbps or 0.0),
        f"the storage's write and read rate, {LEAST_STORAGE_GBPS:g} to "
        f"{MOST_STORAGE_GBPS:,.0f} GB/s",
    )
    out += _whole_write(r) if not out else []
    seconds(r.save_s, "--save-seconds", "the seconds a save blocks training")
    seconds(r.load_s, "--load-seconds", "the seconds a load takes")
    seconds(r.queue_wait_s, "--queue-wait", "the seconds a generation waits for nodes")
    seconds(r.response_s, "--response-minutes", "a person's answer in minutes", unit=60.0)
    seconds(r.storage_stall_s, "--storage-stall", "the stall's seconds")
    seconds(t.save_interval_s, "--save-minutes", "today's save interval", above=True, unit=60.0)
    seconds(t.lease_s, "--lease-stale-after", "today's lease in seconds", above=True)
    seconds(r.step_timeout_s, "--step-timeout", "today's step timeout in seconds", above=True)
    seconds(
        r.node_silence_s,
        "--node-silence-timeout",
        "today's silence timeout in seconds",
        low=1.0,  # the beats come once a second: a shorter timeout takes live nodes out
    )
    seconds(r.step_s, "--step-seconds", "a training step's seconds", low=LEAST_STEP_S)
    need(
        0 <= t.hot_spares <= MOST_SPARES,
        "--hot-spares",
        shown(t.hot_spares),
        f"0 to {MOST_SPARES:,} tasks",
    )
    need(
        0 <= t.cold_spares <= MOST_SPARES,
        "--cold-spares",
        shown(t.cold_spares),
        f"0 to {MOST_SPARES:,} tasks",
    )
    need(1 <= t.depth <= MOST_DEPTH, "--depth", shown(t.depth), f"1 to {MOST_DEPTH:,} generations")
    need(1 <= r.seeds <= MOST_SEEDS, "--seeds", shown(r.seeds), f"between 1 and {MOST_SEEDS}")
    need(r.profile in profiles.NAMES, "--profile", r.profile, f"one of {', '.join(profiles.NAMES)}")
    for name, value in r.overrides.items():
        need(
            name in priced.STEPS,
            "--cost",
            f"{name}={shown(value)}",
            f"{name!r} is no step; choose from {', '.join(priced.STEPS)}",
        )
        seconds(value, "--cost", f"{name}: the step's seconds", given=f"{name}={shown(value)}")
    return out  # fmt: skip


def _whole_write(r: Request) -> list[str]:
    """A checkpoint whose whole write or read at the storage's rate takes longer than any
    step may, where that figure is used (no --save-seconds, no --load-seconds)."""
    if r.save_s is not None and r.load_s is not None:
        return []
    gb = (
        r.checkpoint_gb
        if r.checkpoint_gb is not None
        else CHECKPOINT_GB_PER_GPU * (r.nodes * r.gpus_per_node)
    )
    gbps = STORAGE_GBPS if r.storage_gbps is None else r.storage_gbps
    if gb / gbps <= MOST_SECONDS:
        return []
    return [
        f"--checkpoint-gb {shown(gb)} at --storage-gbps {shown(gbps)}: the whole write "
        f"takes {gb / gbps:.3g} s, over {MOST_SECONDS:,.0f} (30 days); pass a smaller "
        "checkpoint, a faster store, or --save-seconds and --load-seconds"
    ]


def with_history(request: Request, history: ChainHistory) -> Request:
    """The chain's rates (unless the request gives its own), save cost and step in place
    of the defaults; its shape is the request's (the run being planned)."""
    rates = (
        replace(request.rates, source=f"given on the command line; costs from chain {history.name}")
        if request.rates_given
        else Rates(
            node_death=0.0,
            gpu_fault=0.0,
            rank_crash=history.rank_crash,
            hang=0.0,
            task0_loss=history.task0_loss,
            unloadable=request.rates.unloadable,
            source=history.source,
            gpus_per_node=None,
            counted=(
                ("rank_crash", history.in_job_restarts, history.training_node_days),
                ("task0_loss", history.hand_offs, history.task0_node_days),
            ),
        )
    )
    return replace(
        request,
        rates=rates,
        save_s=history.save_s if request.save_s is None else request.save_s,
        step_s=history.step_s if request.step_s is None else request.step_s,
    )


def scenario(request: Request, history: ChainHistory | None = None) -> Scenario:
    shape = priced.Shape(
        request.nodes, request.gpus_per_node, request.nodes_per_task, request.segment
    )
    checkpoint = request.checkpoint_gb
    if checkpoint is None:
        checkpoint = CHECKPOINT_GB_PER_GPU * shape.gpus
    gbps = STORAGE_GBPS if request.storage_gbps is None else request.storage_gbps
    costs = priced.measured(
        shape,
        checkpoint_gb=checkpoint,
        storage_gbps=gbps,
        save_s=request.save_s,
        load_s=request.load_s,
        overrides=request.overrides,
        profile=request.profile,
        queue_wait=request.queue_wait_s,
        step_timeout_s=request.step_timeout_s,
        node_silence_s=request.node_silence_s,
        save_source=(
            f"chain {history.name}: mean of its saves"
            if history is not None and request.save_s == history.save_s
            else "given (--save-seconds)"
        ),
    )
    costs = replace(
        costs,
        checkpoint=priced.Checkpoint(
            gb=checkpoint,
            gb_given=request.checkpoint_gb is not None,
            storage_gbps=gbps,
            storage_given=request.storage_gbps is not None,
            save_given=request.save_s is not None,
            load_given=request.load_s is not None,
        ),
    )
    if history is not None:
        name = history.name

        def whole(seconds: float | None, count: int, what: str) -> priced.Step | None:
            if seconds is None:
                return None
            return priced.Step(
                seconds,
                f"chain {name}: mean of {count} {what}",
                "as measured on that chain's size",
                basis="chain",
            )

        costs = replace(
            costs,
            restart_whole=whole(history.restart_s, history.restarts_measured,
                                "in-job restart(s) on the same nodes"),
            replaced_whole=whole(history.replaced_s, history.replaced_measured,
                                 "in-job restart(s) with a spare in a node's place"),
            hand_off_whole=whole(history.hand_off_s, history.hand_offs_measured,
                                 "hand-off(s) to the next generation"),
            first_start_whole=whole(history.first_start_s, 1, "first start-up(s)"),
        )  # fmt: skip
    return Scenario(
        shape=shape,
        rates=request.rates,
        costs=costs,
        time_limit_s=request.time_limit_s,
        horizon_s=request.days * 86400.0,
        response_s=request.response_s,
        given=request.given,
    )
