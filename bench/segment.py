"""5b. Segment mode: a node of a non-zero task dies -> the first step after the in-job
restart, with the spare NVLink domain taking the dead one's place (issue 30).

The seeds' shape: six nodes in three two-node NVLink domains (the local cluster's
stand-in nvidia-smi), two-node tasks, `--segment 2`, two training domains and a hot
spare domain. For each sample, one generation: once cycle 0 has checkpointed, kill-node
takes down the second node of a training task other than task 0; the sample ends at
the first step of cycle 1, which NVRx forms from task 0's domain and the spare domain.
Marks: the kill (harness clock), NVRx's own events from task 0's launcher (failure
detected, its workers stopped, its next round begun), the round closing (cycle-info),
the trainer's start-up marks, the checkpoint's first read, the first step. Beside them:
when the spare domain's launchers were in the round, and the first checkpoint after
the restart (the issue measured death -> new checkpoint).
"""

from __future__ import annotations

from bench import chains, extract
from bench.extract import RestartSeen
from bench.harness import Harness
from bench.report import Metric, Result, phase_metrics
from bench.timing import nvrx_event
from nvrx_appliance.observe.slurm_output import expand_nodelist

NAME = "segment"
TITLE = "5b segment mode: another task's node dies"
NODES, DOMAIN = 6, 2
CLUSTER = ("--nodes", str(NODES), "--nvlink-domain-size", str(DOMAIN))
SHAPE = (
    "--nodes-per-task", "2", "--gpus-per-node", "1", "--segment", "2",
    "--train-tasks", "2", "--hot-spares", "1", "--cold-spares", "0",
)  # fmt: skip
RESTART_TIMEOUT_S = 180
NVRX_MARKS = ("failure_detected", "worker_terminated", "rendezvous_started")


def quick_flags(*drop: str) -> list[str]:
    """chains.FAST without the options named (each with its value)."""
    out, flags = [], list(chains.FAST)
    while flags:
        name, value = flags.pop(0), flags.pop(0)
        if name not in drop:
            out += [name, value]
    return out


def domains(h: Harness) -> dict[str, str]:
    """Node -> its NVLink domain (the ClusterUUID its stand-in nvidia-smi reports)."""
    return {n["name"]: n.get("cluster_uuid") or n["name"] for n in h.status["nodes"]}


def victim_of(active: list[str], task0_host: str, domain: dict[str, str]) -> str:
    """The second node of a training domain that is not task 0's."""
    others = sorted(n for n in active if domain[n] != domain[task0_host])
    if not others:
        raise extract.Incomplete(f"cycle 0 trained on {active}: no domain but task 0's")
    return others[-1]


def one(h: Harness, silent: bool = False) -> dict:
    work, name = h.workdir(NAME), h.job_name(NAME)
    [gen] = h.submit(work, name, *quick_flags("--segment"), *SHAPE, "--mode", "train",
                     "--depth", "1")  # fmt: skip
    victim = ""
    try:
        started = h.wait_checkpointed(work, "cycle 0", slurm_array_job_id=gen, cycle=0)
        cycle0 = h.wait(lambda: h.cycle(work, gen, 0), 30, "cycle 0's cycle-info")
        domain = domains(h)
        active = expand_nodelist(cycle0.active_nodes)
        victim = victim_of(active, started["host"], domain)
        fault_at = h.kill_node(victim, silent)
        resumed, step = h.wait_resumed(
            work, "cycle 1", RESTART_TIMEOUT_S, slurm_array_job_id=gen, cycle=1
        )
        saved = h.wait_event(
            work, "cycle 1's first checkpoint", 120, "checkpoint", after=resumed["time"],
            slurm_array_job_id=gen, cycle=1,
        )  # fmt: skip
        cycle1 = h.cycle(work, gen, 1)
        host = resumed["host"]
        nvrx = h.nvrx_events_with(work, gen, [(e, 1, host) for e in NVRX_MARKS])
        sample = extract.restart_sample(
            RestartSeen(
                fault_at=fault_at, rank=-1, next=cycle1, checkpoint=h.restored(work, resumed),
                resumed=resumed, first_step=step, nvrx=nvrx,
                fault=f"harness clock, kill-node {'--silent ' if silent else ''}{victim} "
                "(a node of another task)",
            )
        )  # fmt: skip
    finally:
        h.drain(name)
        if victim:
            h.revive_node(victim)
    now_active = set(expand_nodelist(cycle1.active_nodes if cycle1 else ""))
    spare = sorted(now_active - set(active))
    if not spare or domain[victim] in {domain[n] for n in now_active}:
        raise extract.Incomplete(f"cycle 1 trained on {sorted(now_active)}, not the spare domain")
    joined = [t for n in spare if (t := nvrx_event(nvrx, "rendezvous_started", 1, n)) is not None]
    sample["victim"], sample["spare_domain"] = victim, spare
    sample["spare_in_round_s"] = max(joined) - fault_at if len(joined) == len(spare) else None
    sample["to_checkpoint_s"] = saved["time"] - fault_at
    sample["saved_iteration"] = saved.get("iteration")
    return sample


def collect(h: Harness, repeat: int, result: Result, silent: bool = False) -> None:
    h.reshape(*CLUSTER)
    result.notes.append(f"cluster: {NODES} nodes in NVLink domains of {DOMAIN}")
    for n in range(repeat):
        try:
            result.samples.append(one(h, silent))
        except extract.Incomplete as exc:
            result.notes.append(f"sample {n} dropped: {exc}")
        h.say(f"{NAME}: {len(result.samples)}/{repeat} samples")


def finish(result: Result, floor: float | None, death: str = "node death") -> None:
    samples = result.samples
    result.metrics = [
        Metric(f"{death} -> first step after the in-job restart",
               [s["total_s"] for s in samples]),
        *phase_metrics(samples),
        Metric("the spare domain's launchers in the round (after the death)",
               [s["spare_in_round_s"] for s in samples if s["spare_in_round_s"] is not None]),
        Metric(f"{death} -> the first checkpoint after the restart",
               [s["to_checkpoint_s"] for s in samples]),
    ]  # fmt: skip
