"""`nvrx-appliance plan`: the effective training time a run of this shape can expect,
the settings that maximise it, and the seeds' design beside it; a thin face of api.plan."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import click

from nvrx_appliance import api, jsondoc
from nvrx_appliance.cli.fail import fail
from nvrx_appliance.cli.target import METAVAR, not_readable, unreachable
from nvrx_appliance.plan import costs as priced
from nvrx_appliance.plan import profiles, view
from nvrx_appliance.plan import rates as published
from nvrx_appliance.plan import request as asked
from nvrx_appliance.plan.simulate import Settings
from nvrx_appliance.settings.chain import ChainSpec
from nvrx_appliance.settings.generation_end import slurm_seconds

PREFIX = "nvrx-appliance plan"
RATE_HELP = "per 1,000 node-days of the training nodes  [default: Llama 3's: docs/plan.md]"
_DEFAULTS = asked.Request()
# 2 (issue 54): node_death is silent deaths only (GPU faults apart), the settings' worths
# are points of the allocation's goodput that add up, time_limit_seconds is the
# recommended limit (today's beside it).
SCHEMA_VERSION = 2
_SPEC = ChainSpec()


def _cost(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict:
    out = {}
    for value in values:
        name, _, seconds = value.partition("=")
        try:
            out[name.strip()] = float(seconds)
        except ValueError:
            raise click.BadParameter(
                f"{value!r}: give NAME=SECONDS, e.g. detect_node_death=300; names: "
                f"{', '.join(priced.STEPS)}"
            ) from None
    return out


# Slurm's own words for no time limit (sbatch(1), slurm.conf(5) MaxTime), any case.
NO_LIMIT = ("unlimited", "infinite")


def _time(ctx: click.Context, param: click.Parameter, value: str) -> float:
    if value.strip().lower() in NO_LIMIT:
        return math.inf
    seconds = slurm_seconds(value)
    if seconds is None:
        raise click.BadParameter(
            f"{value!r} is no Slurm time; give e.g. 1-00:00:00 (a day), 04:00:00, or 0 or "
            "UNLIMITED (none)"
        )
    # 0 is Slurm's "no time limit", as submit's --time 0 is (no save before a limit).
    return float(seconds) if seconds else math.inf


# (flag, type, default, help): the options with a default; click shows it.
WITH_DEFAULTS = (
    ("--nodes", int, _DEFAULTS.nodes, "Nodes that train (spares come on top)."),
    ("--gpus-per-node", int, _SPEC.gpus_per_node, "GPUs (and ranks) per node."),
    ("--nodes-per-task", int, _SPEC.nodes_per_task, "Nodes per array task: a spare is one task."),
    ("--segment", int, 0, "NVLink domain's nodes in segment mode (0: off)."),
    ("--days", float, _DEFAULTS.days, "The run's wall time."),
    ("--unloadable", float, 0.0, "Share of checkpoint loads that fail (0.01: one in 100)."),
    ("--queue-wait", float, 0.0,
     "Seconds a generation waits for nodes after the last (0: a reservation)."),
    ("--response-minutes", float, 60.0, "A person's answer to a stopped chain (assumed)."),
    ("--storage-stall", float, asked.STORAGE_STALL_S,
     "The longest shared-file-system stall task 0's lease must ride out, s."),
    ("--save-minutes", float, 30.0, "Today's save interval, minutes of training."),
    ("--hot-spares", int, _SPEC.hot_spares, "Today's hot spares."),
    ("--cold-spares", int, _SPEC.cold_spares, "Today's cold spares."),
    ("--lease-stale-after", float, _SPEC.lease_stale_after, "Today's lease, s."),
    ("--depth", int, _SPEC.depth, "Today's chain depth."),
    ("--step-timeout", float, float(_SPEC.step_timeout),
     "Today's step timeout, s: what a hang costs before its node is named."),
    ("--node-silence-timeout", float, priced.DEFAULT_NODE_SILENCE_S,
     "Today's silence timeout, s: a node silent that long leaves the cycle."),
    ("--seeds", int, _DEFAULTS.seeds, "Simulated runs averaged."),
)  # fmt: skip
# (flag, help): the options that are None unless given.
WITHOUT = (
    ("--node-death", f"Silent node deaths (host or link gone) {RATE_HELP}"),
    ("--gpu-fault", "GPU faults (the rank crashes, the host lives, the node leaves) per 1,000 "
     "node-days  [default: Llama 3's, per GPU: docs/plan.md]"),
    ("--rank-crash", f"Rank crashes (the node lives) {RATE_HELP}"),
    ("--hang", f"Hangs {RATE_HELP}"),
    ("--task0-loss", "Losses of task 0 beyond node deaths on its nodes, per 1,000 node-days "
     "of its nodes  [default: 0]"),
    ("--total-rate", "Every interruption together, per 1,000 node-days (arXiv 2410.21680's "
     "form), split as Llama 3's classes are; instead of --node-death ..."),
    ("--checkpoint-gb", "The whole checkpoint, GB  [default: 4 GB per GPU, Llama 3's largest]"),
    ("--storage-gbps", "Storage write and read rate, GB/s  [default: 2,000, Llama 3's sustained]"),
    ("--save-seconds", "Seconds a save blocks training, not size / rate: under --async-save "
     "(Megatron chains' default) only its staging copy blocks."),
    ("--load-seconds", "Seconds a load takes, not size / rate (a local or in-memory restore)."),
    ("--step-seconds", "A training step's seconds: the save interval in iterations too."),
)  # fmt: skip


def _options(command: Callable[..., Any]) -> Callable[..., Any]:
    # Applied from the last: --help lists the shape first, then the rates and the rest.
    for name, text in reversed(WITHOUT):
        command = click.option(name, type=float, help=text)(command)
    for name, kind, default, text in reversed(WITH_DEFAULTS):
        command = click.option(name, type=kind, default=default, show_default=True, help=text)(
            command
        )
    return command


@click.command("plan")
@_options
@click.option(
    "--time",
    "time_limit",
    default=_SPEC.time_limit,
    show_default=True,
    callback=_time,
    help="Today's time limit of one generation (submit's --time); 0 or UNLIMITED: none.",
)
@click.option(
    "--max-time",
    default="1-00:00:00",
    show_default=True,
    callback=_time,
    help="The longest --time your partition allows (`scontrol show partition`: MaxTime); "
    "the plan recommends it. 0 or UNLIMITED: none.",
)
@click.option(
    "--from-chain",
    metavar=METAVAR,
    help="Take the failure rates (unless given: --node-death ...), the save's and the "
    "restart's cost from this chain's history (report's account) instead.",
)
@click.option(
    "--work-dir",
    help="A chain's work dir, read from its own files (ledger, cycle-info files, training "
    "record) without asking Slurm: instead of --from-chain, or beside it.",
)
@click.option(
    "--cost",
    "costs",
    multiple=True,
    callback=_cost,
    metavar="NAME=SECONDS",
    help=f"Your own figure for a step ({', '.join(priced.STEPS)}); repeatable.",
)
@click.option(
    "--profile",
    type=click.Choice(profiles.NAMES),
    default=profiles.DEFAULT,
    show_default=True,
    help="Recovery costs: cluster (a real GPU cluster: published figures where they exist, "
    "said assumptions elsewhere) or local (measured on the local cluster's CPU stand-in).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plan_command(**o) -> None:
    """Plan a run at scale: its effective training time (ETTR), by cause.

    Simulates the run (seeded, discrete events) with a real GPU cluster's recovery
    costs (--profile local: the CPU stand-in's, docs/benchmarks.md), shows the closed
    form beside it, the time limit, save interval, spares, lease and depth that maximise
    it and what each is worth, the road to 98% (what each lever past that is worth, and
    whether the appliance has it), and the seeds' design at the same settings.
    docs/plan.md has the assumptions.
    """
    given = [f"--{k.replace('_', '-')}" for k in published.RATE_FIELDS if o[k] is not None]
    if o["total_rate"] is not None and given:
        fail(f"--total-rate: give it or {', '.join(given)}, not both", prefix=PREFIX)
    total = o["total_rate"]
    if total is not None and not (math.isfinite(total) and 0 <= total <= asked.MOST_RATE):
        fail(
            f"--total-rate {asked.shown(total)}: interruptions per 1,000 node-days, 0 to "
            f"{asked.MOST_RATE:,.0f} (Llama 3's: 3.8)",
            prefix=PREFIX,
        )
    defaults = (
        published.Rates() if o["total_rate"] is None else published.from_total(o["total_rate"])
    )
    rates = replace(
        defaults,
        **{k: o[k] for k in published.RATE_FIELDS if o[k] is not None},
        unloadable=o["unloadable"],
        source=defaults.source if not given else "given on the command line",
        # A GPU fault rate given is per node of the planned shape: nothing rescaled.
        gpus_per_node=None if o["gpu_fault"] is not None else defaults.gpus_per_node,
    )
    request = asked.Request(
        nodes=o["nodes"],
        gpus_per_node=o["gpus_per_node"],
        nodes_per_task=o["nodes_per_task"],
        segment=o["segment"],
        days=o["days"],
        time_limit_s=o["time_limit"],
        most_time_s=o["max_time"],
        rates=rates,
        checkpoint_gb=o["checkpoint_gb"],
        storage_gbps=o["storage_gbps"],
        save_s=o["save_seconds"],
        load_s=o["load_seconds"],
        queue_wait_s=o["queue_wait"],
        response_s=o["response_minutes"] * 60.0,
        storage_stall_s=o["storage_stall"],
        today=Settings(
            o["save_minutes"] * 60.0,
            o["hot_spares"],
            o["cold_spares"],
            o["lease_stale_after"],
            o["depth"],
        ),
        grace_s=float(_SPEC.closed_flag_grace),
        step_s=o["step_seconds"],
        overrides=o["costs"],
        profile=o["profile"],
        step_timeout_s=o["step_timeout"],
        node_silence_s=o["node_silence_timeout"],
        seeds=o["seeds"],
        rates_given=bool(given) or o["total_rate"] is not None,
        given=frozenset(
            name
            for name, option in (("queue_wait", "queue_wait"), ("response", "response_minutes"))
            if click.get_current_context().get_parameter_source(option)
            is not click.core.ParameterSource.DEFAULT
        ),
    )
    try:
        plan = api.plan(request, from_chain=o["from_chain"], work_dir=o["work_dir"])
    except api.SettingsError as exc:
        for problem in exc.problems[:-1]:
            click.echo(f"{PREFIX}: {problem}", err=True)
        fail(exc.problems[-1], prefix=PREFIX)
    except api.ChainNotFound as exc:
        fail(not_readable(exc, o["from_chain"]), prefix=PREFIX)
    except api.SlurmUnreachable as exc:
        unreachable(PREFIX, str(exc), "pass the chain's --work-dir to read its files")
    if o["as_json"]:
        click.echo(jsondoc.dumps("plan", view.to_json(plan), strict=True, version=SCHEMA_VERSION))
        return
    for line in view.lines(plan, plan.step_s):
        click.echo(line)
