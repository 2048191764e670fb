"""The guard's side of the flight recorder (docs/hangs.md): what the workload's
environment gets so that its own Python watches the recorder (flight_site/), and the
recorder's summaries read back at the judgement.

A summary is written only by a rank whose collective stood still past the stall time,
once per stall, and removed when that collective completes. It is kept node-local, in
the node's stacks directory (`cycle<N>/flight/<node>.rank<R>.json`), and the node's one
publisher carries the node's summaries in its one shared file per period (`flight` in
`stacks/cycle<N>/<node>.json`, node/stack_publisher.py): nothing per rank on the shared
file system, even while every rank but one waits through rank 0's ten-minute save. A
guard outside the entrypoint (no node-local directory) writes its own to
`stacks/cycle<N>/flight/`, as it does its samples.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nvrx_appliance import files
from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.rank.flight_site import sitecustomize as site
from nvrx_appliance.rank.sampler import LOCAL_STACKS_ENV

SITE_DIR = str(Path(site.__file__).resolve().parent)
# PyTorch records collectives only with a buffer, read once at init_process_group;
# 2,000 entries is what node/env.py asks for Megatron. torch 2.13 reads the first of its
# two names that is set (FlightRecorder.hpp: getCvarInt({"TORCH_FR_BUFFER_SIZE",
# "TORCH_NCCL_TRACE_BUFFER_SIZE"}, ...)), so ours is set only where the site set neither:
# a site's value wins under either name.
BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
BUFFER_NAMES = (BUFFER_ENV, "TORCH_NCCL_TRACE_BUFFER_SIZE")
BUFFER_ENTRIES = "2000"
DUMP_BYTES = 4 << 20  # a summary read back (a dump of the first version: ~130 kB)
MAX_DUMPS = 100_000
NODE_FILE_BYTES = 64 << 20  # a node's published file: its ranks' samples and summaries
WAITS_DIR = "waits"  # in a cycle's node-local stacks directory


def flight_dir(stacks_of_cycle: Path) -> Path:
    return stacks_of_cycle / "flight"


def stall_s(period: float) -> float:
    """How long a collective stands still before its rank writes its dump: two sampling
    periods, the time the stacks also need to call a rank still (stacks.still_s); the
    step timeout leaves three periods (submit refuses less)."""
    return 2 * period


def child_env(environ: Mapping[str, str], generation: str) -> dict[str, str] | None:
    """The workload's environment with the watch switched on; None (inherit ours as it is)
    where the chain judges no hangs (no stack sampling) or there is no run manifest."""
    try:
        manifest = run_manifest.load(Path(environ["NVRX_RUN_MANIFEST"]))
    except (KeyError, run_manifest.ManifestError):
        return None
    period = float(manifest.spec.stack_sampling)
    if period <= 0:
        return None
    array_job_id = generation.split("/")[1] if generation.count("/") >= 2 else ""
    cycle = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    cycle = cycle if cycle.isdecimal() else "0"
    local = environ.get(LOCAL_STACKS_ENV)
    # node-local where the node's publisher carries it, else the work dir (per rank)
    where = flight_dir((Path(local) if local else manifest.layout.stacks(array_job_id))
                       / f"cycle{cycle}")  # fmt: skip
    path = environ.get("PYTHONPATH", "")
    # the ranks' time inside collectives, kept on the node for its publisher
    # (node/stack_publisher.py); never per rank on the shared file system
    waits = (
        {site.WAITS_ENV: json.dumps({"dir": str(Path(local) / f"cycle{cycle}" / WAITS_DIR),
                                     "period": period, "generation": array_job_id})}
        if local and array_job_id else {}
    )  # fmt: skip
    return {
        **environ,
        "PYTHONPATH": SITE_DIR + (os.pathsep + path if path else ""),
        site.DIR_ENV: str(where),
        site.STALL_ENV: f"{stall_s(period):g}",
        site.WHO_ENV: json.dumps({"generation": generation, "cycle": int(cycle)}),
        **({} if any(environ.get(n) for n in BUFFER_NAMES) else {BUFFER_ENV: BUFFER_ENTRIES}),
        **waits,
    }


def read_dumps(stacks_of_cycle: Path, generation: str, cycle: int) -> list[dict[str, Any]]:
    """The cycle's recorder summaries: those the nodes' publishers carry in their files
    (`flight`), and any a guard without a publisher wrote itself (`flight/`); a torn,
    foreign or older one is skipped."""
    found = []
    for directory, carried in ((flight_dir(stacks_of_cycle), False), (stacks_of_cycle, True)):
        try:
            names = sorted(os.listdir(directory))[:MAX_DUMPS]
        except OSError:
            continue
        for name in names:
            if not name.endswith(".json") or name.startswith(".") or (carried and ".rank" in name):
                continue
            try:
                data = json.loads(files.read_text(directory / name, NODE_FILE_BYTES) or "")
            except (OSError, ValueError):
                continue
            items = (data.get("flight") if carried else [data]) if isinstance(data, dict) else []
            found += [
                d for d in items or []
                if isinstance(d, dict) and d.get("generation") == generation
                and d.get("cycle") == cycle and isinstance(d.get("trace"), dict)
            ]  # fmt: skip
    return found
