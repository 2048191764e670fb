"""The guard's side of the flight recorder (docs/hangs.md): what the workload's
environment gets so that its own Python watches the recorder (flight_site/), and the
dumps read back at the judgement.

    nvrx/<array job id>/stacks/cycle<N>/flight/<node>.rank<R>.json   (owner-only)

A dump is written only by a rank whose collective stood still past the stall time, once
per stall, and removed when that collective completes: at a hang, one file per waiting
rank; none at all in a run that never stalls.
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
# PyTorch records collectives only with a buffer (TORCH_FR_BUFFER_SIZE, read once at
# init_process_group); 2,000 entries is what node/env.py asks for Megatron. A site's own
# value wins.
BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
BUFFER_ENTRIES = "2000"
DUMP_BYTES = 4 << 20  # a dump read back: 256 entries are ~130 kB
MAX_DUMPS = 100_000
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
    where = flight_dir(manifest.layout.stacks(array_job_id) / f"cycle{cycle}")
    path = environ.get("PYTHONPATH", "")
    local = environ.get(LOCAL_STACKS_ENV)
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
        BUFFER_ENV: environ.get(BUFFER_ENV) or BUFFER_ENTRIES,
        **waits,
    }


def read_dumps(directory: Path, generation: str, cycle: int) -> list[dict[str, Any]]:
    """The cycle's flight-recorder dumps; a torn, foreign or older one is skipped."""
    try:
        names = sorted(os.listdir(directory))[:MAX_DUMPS]
    except OSError:
        return []
    found = []
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            data = json.loads(files.read_text(directory / name, DUMP_BYTES) or "")
        except (OSError, ValueError):
            continue
        if (
            isinstance(data, dict)
            and data.get("generation") == generation
            and data.get("cycle") == cycle
            and isinstance(data.get("trace"), dict)
        ):
            found.append(data)
    return found


def earlier_stalls(hangs: Path, generation: str) -> dict[str, list[int]]:
    """The generation's earlier stalls judged the workload's: {node: the ranks on it that
    held the others}, so that a node that holds the others again with other ranks on it
    is seen (stall_rule.py)."""
    try:
        names = sorted(
            n for n in os.listdir(hangs) if n.startswith("cycle") and n.endswith(".json")
        )
    except OSError:
        return {}
    found: dict[str, list[int]] = {}
    for name in names[:MAX_DUMPS]:
        try:
            record = json.loads(files.read_text(hangs / name, DUMP_BYTES) or "")
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("generation") != generation:
            continue
        if record.get("verdict") == "workload" and isinstance(record.get("stalled"), dict):
            for node, ranks in record["stalled"].items():
                found[str(node)] = [int(r) for r in ranks if isinstance(r, int)]
    return found
