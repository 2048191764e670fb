"""1. Scheduler floor: what Slurm itself costs between two generations of a chain.

A chain of trivial generations with exactly the sbatch options and array shape that
`submit` gives a real one (rendered by the same function), whose tasks exit at once.
Each sample: the last task of generation N ends -> task 0 of N+1 starts, from
slurmctld's log (ms) and sacct (s). Every other latency is reported against it.
"""

from __future__ import annotations

import datetime
import itertools
import sys

from bench import chains, extract
from bench.harness import Harness
from bench.report import FLOOR_LABEL, Metric, Result
from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.chain import render
from nvrx_appliance.observe import slurmcli
from nvrx_appliance.settings.chain import ChainSpec

NAME = "floor"
TITLE = "1 scheduler floor"
TRIVIAL = "#!/bin/bash\n# A generation that does nothing: only the scheduler's own cost remains.\nexit 0\n"


def sbatch_args(spec: ChainSpec) -> list[str]:
    manifest = run_manifest.build(
        spec,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(),
        user=slurmcli.current_user(),
    )
    return render.sbatch_args(manifest)


def collect(h: Harness, repeat: int, result: Result) -> None:
    work, name = h.workdir(NAME), h.job_name(NAME)
    spec = ChainSpec(
        train_tasks=chains.TRAIN_TASKS,
        hot_spares=chains.HOT_SPARES,
        cold_spares=chains.COLD_SPARES,
        gpus_per_node=chains.WORKERS_PER_NODE,
        depth=repeat + 1,
        job_name=name,
        work_dir=str(work),
        workload="cpu",
        runtime="bare",
        python=sys.executable,
        time_limit="00:10:00",
    )
    (work / "logs").mkdir()
    script = work / "trivial.sbatch"
    script.write_text(TRIVIAL)
    args = sbatch_args(spec)
    # The work dir is this machine's: the committed results name it <work>.
    result.notes.append(f"sbatch options: {' '.join(args).replace(str(work), '<work>')}")
    ids = [h.sbatch(args, script) for _ in range(spec.depth)]
    result.notes.append(f"generations: {', '.join(ids)}")
    all_tasks = h.wait_final(ids, timeout=60 + 15 * spec.depth)
    by_generation = [[t for t in all_tasks if t.array_job_id == i] for i in ids]
    for previous, successor in itertools.pairwise(by_generation):
        result.samples.append(extract.floor_sample(previous, successor))


def finish(result: Result, floor: float | None) -> None:
    result.metrics = [Metric(FLOOR_LABEL, [s["total_s"] for s in result.samples])]
