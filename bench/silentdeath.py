"""15. A node that dies silently (issue 52), beside one that crashes, at the appliance's
defaults and at the demo's quick timeouts.

A silent death takes the node's link down before its processes die (`kill-node
--silent`: a power loss, a dead NIC), so no peer reads a reset; a crash kills them with
the link up (`kill-node`: their connections reset at once). For each (death, settings)
pair, `repeat` chains of the built-in trainer, 2 training tasks of 2 ranks and 1 hot
spare, checkpointing every 10 steps of 0.1 s; once one checkpoint exists:

- a training node that is not task 0's dies: death -> NVRx's failure detected (task 0's
  launcher), -> training again (the next cycle's start), -> the next checkpoint;
- task 0's node dies: death -> the next generation trains, -> its first checkpoint.

Targets (issue 52), at the defaults: a training node's silent death back to a
checkpoint within 60 s; task 0's within the lease plus 15 s.
"""

from __future__ import annotations

from bench import chains, extract
from bench.harness import Harness
from bench.report import Metric, Result
from nvrx_appliance.observe.slurm_output import expand_nodelist
from nvrx_appliance.settings.chain import ChainSpec

NAME = "silentdeath"
TITLE = "15 node death: silent and crash"
DEFAULTS = ChainSpec(work_dir="/")
SHAPE = (
    "--train-tasks", "2", "--hot-spares", "1", "--cold-spares", "0", "--gpus-per-node", "2",
    "--mode", "train", "--cpu-step-pause", "0.1", "--save-interval", "10",
    "--save-retention", "2",
)  # fmt: skip
# The appliance's own defaults (submit's), in place of chains.FAST's quick timeouts.
AT_DEFAULTS = (
    "--workload", "cpu", "--runtime", "bare", "--segment", "off", "--time", "00:20:00",
    *(arg for name in ("setup_timeout", "step_timeout", "checkpointing_timeout",
                       "out_of_section_timeout", "join_timeout", "store_connect_wait",
                       "rdzv_host_wait", "lease_stale_after")
      for arg in (f"--{name.replace('_', '-')}", str(getattr(DEFAULTS, name)))),
)  # fmt: skip
SETTINGS = {"defaults": AT_DEFAULTS, "demo": chains.FAST}
LEASE_S = {"defaults": float(DEFAULTS.lease_stale_after),
           "demo": float(chains.FAST[chains.FAST.index("--lease-stale-after") + 1])}  # fmt: skip
DEATHS = ("silent", "crash")
PEER_TARGET_S = 60.0  # a training node's silent death at the defaults -> next checkpoint
TASK0_BEYOND_LEASE_S = 15.0  # task 0's -> the successor's first checkpoint, beyond the lease
WAIT_S = 900.0  # a silent death at the demo's timeouts without liveness would take ~70 s


def _peer(h: Harness, settings: str, death: str) -> dict:
    work, name = h.workdir(NAME), h.job_name(NAME)
    [gen] = h.submit(work, name, *SETTINGS[settings], *SHAPE, "--depth", "1")
    victim = ""
    try:
        started = h.wait_checkpointed(work, "cycle 0", slurm_array_job_id=gen, cycle=0)
        cycle0 = h.wait(lambda: h.cycle(work, gen, 0), 60, "cycle 0's cycle-info")
        task0 = started["host"]
        others = sorted(set(expand_nodelist(cycle0.active_nodes)) - {task0})
        if not others:
            raise extract.Incomplete(f"cycle 0 trained on {cycle0.active_nodes} alone")
        victim = others[0]
        died = h.kill_node(victim, silent=death == "silent")
        resumed = h.wait_event(work, "cycle 1 to train", WAIT_S, "start",
                               slurm_array_job_id=gen, cycle=1)  # fmt: skip
        saved = h.wait_event(work, "cycle 1's first checkpoint", 120, "checkpoint",
                             slurm_array_job_id=gen, cycle=1)  # fmt: skip
        events = h.nvrx_events_with(work, gen, [("failure_detected", 1, task0)])
        detected = min(
            (
                e.time
                for e in events
                if (e.event, e.cycle, e.host) == ("failure_detected", 1, task0)
            ),
            default=None,
        )
    finally:
        h.drain(name)
        if victim:
            h.revive_node(victim)
    return {
        "settings": settings, "death": death, "victim": "peer", "node": victim,
        "detected_s": None if detected is None else detected - died,
        "trains_s": resumed["time"] - died, "checkpoint_s": saved["time"] - died,
    }  # fmt: skip


def _task0(h: Harness, settings: str, death: str) -> dict:
    work, name = h.workdir(NAME), h.job_name(NAME)
    [gen, successor] = h.submit(work, name, *SETTINGS[settings], *SHAPE, "--depth", "2")
    victim = ""
    try:
        started = h.wait_checkpointed(work, "generation 1", slurm_array_job_id=gen)
        victim = started["host"]
        died = h.kill_node(victim, silent=death == "silent")
        resumed = h.wait_event(work, "the successor to train", WAIT_S, "start",
                               slurm_array_job_id=successor)  # fmt: skip
        saved = h.wait_event(work, "the successor's first checkpoint", 120, "checkpoint",
                             slurm_array_job_id=successor)  # fmt: skip
    finally:
        h.drain(name)
        if victim:
            h.revive_node(victim)
    return {
        "settings": settings, "death": death, "victim": "task0", "node": victim,
        "trains_s": resumed["time"] - died, "checkpoint_s": saved["time"] - died,
    }  # fmt: skip


def collect(h: Harness, repeat: int, result: Result) -> None:
    for settings in SETTINGS:
        for death in DEATHS:
            for measure in (_peer, _task0):
                for n in range(repeat):
                    try:
                        result.samples.append(measure(h, settings, death))
                    except extract.Incomplete as exc:
                        result.notes.append(f"{settings} {death} sample {n} dropped: {exc}")
                h.say(f"{NAME}: {settings}, {death}, {measure.__name__[1:]}: done")


def _of(samples: list[dict], key: str, **match: str) -> list[float]:
    return [
        s[key] for s in samples
        if all(s.get(k) == v for k, v in match.items()) and s.get(key) is not None
    ]  # fmt: skip


def finish(result: Result, floor: float | None) -> None:
    samples, metrics = result.samples, []
    for settings in SETTINGS:
        for death in DEATHS:
            peer = {"settings": settings, "death": death, "victim": "peer"}
            task0 = {"settings": settings, "death": death, "victim": "task0"}
            silent_defaults = settings == "defaults" and death == "silent"
            metrics += [
                Metric(f"{settings}, {death}: a training node dies -> the next checkpoint",
                       _of(samples, "checkpoint_s", **peer),
                       target_s=PEER_TARGET_S if silent_defaults else None),
                Metric("NVRx's failure detected (task 0's launcher)",
                       _of(samples, "detected_s", **peer), indent=True),
                Metric("training again (the next cycle starts)",
                       _of(samples, "trains_s", **peer), indent=True),
                Metric(f"{settings}, {death}: task 0's node dies -> the successor's first "
                       "checkpoint", _of(samples, "checkpoint_s", **task0),
                       target_s=LEASE_S[settings] + TASK0_BEYOND_LEASE_S
                       if silent_defaults else None),
                Metric("the successor trains", _of(samples, "trains_s", **task0), indent=True),
            ]  # fmt: skip
    result.metrics = [m for m in metrics if m.samples]
