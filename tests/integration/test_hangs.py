"""A node that hangs (issue 38), on the real cluster: real ft_launcher 0.7.0 ends the
hung cycle at its step timeout (SIGCONT then SIGKILL to each workload), each rank's
guard has sampled its stack with the real py-spy, the hang rule names the node, the
entrypoint's health check takes it out of the next rendezvous and the hot spare trains.

The sick node is made from outside, as a user meets one: every worker on it is frozen
(SIGSTOP) a few seconds into each cycle, once that cycle trains: no error, no exit.
Under the built-in trainer and under a user's script that keeps the contract
(examples/train_script.py, through verdict_script.py for its optional progress log),
with NVRx's sections and without them: then NVRx's rank monitor does not watch the
script, and each rank's guard keeps --out-of-section-timeout (rank/stillness.py).
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nvrx_appliance.devcluster.sick_node import Freezer
from nvrx_appliance.observe.run_files import cycle_info
from nvrx_appliance.observe.slurm_output import expand_nodelist
from nvrx_appliance.observe.workdir import json_lines

from .chain_support import (
    cli,
    cycle_nodes,
    logs_on_failure,
    progress,
    ran,
    slow_storage,
    started_in_cycle,
    submit,
    tasks,
    unique,
    wait_event,
    wait_idle,
    wait_in,
    wait_ledger,
)
from .conftest import Cluster

pytestmark = [pytest.mark.cluster]

CYCLE_S = 180  # a fault noticed, the next rendezvous formed, training resumed
# Shorter than the demo's (30 s and 60 s, chain_support.FAST), which only lengthen
# each test here: submit's floor is three sampling periods (15 s), and 20 s leaves the
# stacks their two periods to call a rank still and a period to spare.
STEP_TIMEOUT_S = 20
OUT_OF_SECTION_S = 20
SETUP_TIMEOUT_S = 30  # the start-up test's (the demo's 120 s only lengthens it)
SAVE_S = 3  # each file a save creates waits this long, in the save test
STACK_PERIOD_S = 5  # --stack-sampling's default: stillness is seen a period late at most
CPU = ("--mode", "train", "--train-samples", "10000000", "--cpu-step-pause", "0.1")
SCRIPT = Path(__file__).parent / "verdict_script.py"


def _script(cluster: Cluster, label: str, *extra: str) -> tuple[str, ...]:
    """The flags of a user's script workload, paced as the cpu trainer below."""
    args = cluster.work_root / f"{unique(label)}.args"
    args.write_text("".join(f"{a}\n" for a in ("--progress", "--iterations", "10000000",
                                                "--step-seconds", "0.1", *extra)))  # fmt: skip
    return ("--workload", "script", "--script", str(SCRIPT), "--script-args", str(args))


@contextmanager
def _chain(
    cluster: Cluster,
    label: str,
    *flags: str,
    workload: tuple[str, ...] = CPU,
    save_every: int = 50,
    env: dict[str, str] | None = None,
) -> Iterator[tuple[Path, str, list[str]]]:
    work, name = cluster.workdir(label), unique(label)
    # Ten steps a second and, unless a test asks otherwise, a checkpoint every 50 (not
    # the demo's every 5), so that the checkpoint held at the hang is known: the freeze,
    # 3 s into the cycle's training, comes about 2 s before its first save.
    timeouts = ("--step-timeout", str(STEP_TIMEOUT_S),
                "--out-of-section-timeout", str(OUT_OF_SECTION_S))  # fmt: skip
    generations = submit(cluster, work, name, *workload, "--save-interval", str(save_every),
                         *timeouts, *flags, env=env)  # fmt: skip
    try:
        yield work, name, generations
    finally:
        cli(cluster, "cancel", name)
        wait_idle(cluster, name, timeout=120)


def _hang_record(work: Path, gen: str, cycle: int) -> dict:
    path = work / "nvrx" / gen / "hangs" / f"cycle{cycle}.json"
    return wait_in(
        work, lambda: json.loads(path.read_text()) if path.exists() else None, CYCLE_S,
        f"the hang record of cycle {cycle}",
    )  # fmt: skip


def _held(work: Path, gen: str, before: float) -> int:
    """The checkpoint the run held when its workers froze."""
    saved = [
        e["iteration"] for e in progress(work)
        if e["event"] == "checkpoint" and e.get("slurm_array_job_id") == gen and e["time"] <= before
    ]  # fmt: skip
    return max(saved, default=0)


# A user's script without NVRx's sections. A workload with them, stopped in a step, is
# the built-in trainer of the hand-off test and of the save, start-up and kernel tests
# (each with the hot spare training on); a user's script with them reaches NVRx's step
# timeout the same way, and one more run of it here would only lengthen CI.
def test_a_hung_node_is_named_and_the_hot_spare_trains_past_the_checkpoint_held_at_the_hang(
    cluster: Cluster,
):
    # A cold spare waits behind the throttle: when the hung node's task ends, it must not
    # take that node (the cluster's fourth node is free).
    flags = ("--train-tasks", "2", "--hot-spares", "1", "--cold-spares", "1", "--depth", "1")
    label = "hang-script-without-sections"
    # Never connected to NVRx's rank monitor: the guard keeps the out-of-section timeout
    # (rank/stillness.py), as the contract says.
    workload = _script(cluster, label, "--no-sections")
    timeout = OUT_OF_SECTION_S + STACK_PERIOD_S
    with _chain(cluster, label, *flags, workload=workload) as (work, name, [gen]):
        started_in_cycle(work, gen, 0, CYCLE_S)
        active, _ = cycle_nodes(work, gen, 0)
        task0 = _node_of_task0(work, gen)
        (sick,) = active - {task0}
        with Freezer(work, {sick}) as freezer:
            frozen_at = Cluster.wait_until(freezer.first, CYCLE_S, "a frozen worker", 0.5)
            held = _held(work, gen, frozen_at)
            record = _hang_record(work, gen, 0)
            assert record["verdict"] == "hung" and record["nodes"] == [sick], _read(record)
            # Where the others wait depends on the moment: the step's all_reduce, DDP's
            # gradient all-reduce in backward, or its buffers' broadcast before forward.
            assert re.fullmatch(
                # Its two ranks may stop in different places (a script's `anyone_asked` and
                # `main`): the words name each.
                rf"{sick} hung in cycle 0: its 2 ranks stopped in `[^`]+`( / `[^`]+`)* while the 2 "
                r"others waited in `(all_reduce|broadcast_coalesced)`( / `(all_reduce|broadcast_coalesced)`)?"
                # gloo's flight recorder, dumped by the waiting ranks' own watch, says whom
                # they waited for (docs/hangs.md)
                r" \(flight recorder: rank\(s\) \d, \d waited in `gloo:[a-z_]+` #\d+ of "
                r"process group 0 for rank\(s\) \d, \d\)",
                record["words"],
            ), record
            assert not record["hand_off"]  # the hot spare is free
            # The cold spare (task 3), still pending, now keeps off the hung node.
            wait_in(work, lambda: sick in _excluded(cluster, name, 3), 30,
                    f"the pending cold spare to exclude {sick}")  # fmt: skip
            hangs = sorted(p.name for p in (work / "nvrx" / gen / "hangs").glob("[!.]*"))
            assert hangs == ["cycle0.json", f"hung.{sick}"]  # no other node blamed
            still = list((work / "nvrx" / gen / "hangs").glob(".still.cycle0.*.json"))
            assert still, "the guard ended no rank for its stillness"
            assert "never connected to NVRx's rank monitor" in json.loads(
                still[0].read_text())["words"]  # fmt: skip
            # Training goes on past the checkpoint held at the hang, in the next cycle:
            # one timeout and one in-job restart.
            moved = wait_event(
                work,
                lambda e: e["event"] == "checkpoint" and e.get("slurm_array_job_id") == gen
                and e["iteration"] > held,
                timeout + CYCLE_S,
                f"a checkpoint past iteration {held}",
            )  # fmt: skip
            assert moved["cycle"] == 1, logs_on_failure(work)
            active, _ = cycle_nodes(work, gen, 1)
            assert sick not in active and task0 in active, logs_on_failure(work)
            assert not (work / "chain.jsonl").exists()  # the chain did not end
            status = cli(cluster, "status", name).stdout
            assert f"{sick} hung in cycle 0" in status, status
            stacks = cli(cluster, "logs", name, "--stacks").stdout
            # its two ranks may stand in one place or two (one group each)
            assert re.search(rf"ranks? [\d, ]+ on {sick} stood in `", stacks), stacks
            assert re.search(rf"ranks \d+, \d+ on {task0} waited in `", stacks), stacks
        spare = tasks(cluster, gen)[3]
        assert not ran(spare) or spare["NodeList"] != sick, spare


def test_without_a_free_hot_spare_the_hung_node_is_handed_off_and_the_next_generation_runs_without_it(
    cluster: Cluster,
):
    flags = ("--train-tasks", "2", "--hot-spares", "0", "--cold-spares", "0", "--depth", "2")
    with _chain(cluster, "hangoff", *flags) as (work, _name, [first, second]):
        started_in_cycle(work, first, 0, CYCLE_S)
        active, _ = cycle_nodes(work, first, 0)
        (sick,) = active - {_node_of_task0(work, first)}
        with Freezer(work, {sick}):
            record = _hang_record(work, first, 0)
            assert record["nodes"] == [sick] and record["hand_off"], _read(record)
            [entry] = wait_ledger(work, 1, CYCLE_S)
            assert "no hot spare was free, so the generation handed off" in entry["reason"]
            assert [h["node"] for h in entry["hung"]] == [sick]
            started_in_cycle(work, second, 0, CYCLE_S)
        assert sick not in cycle_nodes(work, second, 0)[0], logs_on_failure(work)
        kept = [e for e in json_lines(work / "exclusions.jsonl") if e.get("node") == sick]
        assert kept and kept[-1]["evidence"] == "hung", kept
        wait_event(
            work, lambda e: e["event"] == "checkpoint" and e.get("slurm_array_job_id") == second,
            CYCLE_S, "the next generation to checkpoint",
        )  # fmt: skip


def test_a_hang_on_every_rank_blames_no_node(cluster: Cluster):
    flags = ("--train-tasks", "2", "--hot-spares", "0", "--cold-spares", "0", "--depth", "1")
    with _chain(cluster, "hangall", *flags) as (work, _, [gen]):
        started_in_cycle(work, gen, 0, CYCLE_S)
        active, _ = cycle_nodes(work, gen, 0)
        with Freezer(work, active):
            record = _hang_record(work, gen, 0)
        assert record["verdict"] == "none" and record["nodes"] == [], _read(record)
        assert record["words"] == (
            "no verdict in cycle 0: no rank waited in a collective: every rank stopped in its "
            "own code"
        )
        assert len(record["stacks"]) == 4 and record["groups"]  # kept for a person
        assert not list((work / "nvrx" / gen / "hangs").glob("hung.*"))


def test_a_node_that_hangs_inside_a_checkpoint_save_is_named_at_its_first_hang(
    cluster: Cluster,
):
    # As the user met it: saves are long on real storage, so a fault often lands
    # in one. Here each save waits SAVE_S on slow storage (slow_storage.c), and the sick
    # node's workers are frozen inside the first save after 3 s of training: the others
    # wait in the save's own collectives, and their flight recorders say for whom.
    flags = ("--train-tasks", "2", "--hot-spares", "1", "--cold-spares", "0", "--depth", "1",
             "--checkpointing-timeout", str(STEP_TIMEOUT_S))  # fmt: skip
    slow = slow_storage(cluster, NVRX_SLOW_SAVE_S=SAVE_S)
    with _chain(cluster, "hang-save", *flags, save_every=20, env=slow) as (work, _name, [gen]):
        started_in_cycle(work, gen, 0, CYCLE_S)
        active, _ = cycle_nodes(work, gen, 0)
        (sick,) = active - {_node_of_task0(work, gen)}
        with Freezer(work, {sick}, in_save=True) as freezer:
            frozen_at = Cluster.wait_until(freezer.first, CYCLE_S, "a worker frozen in a save", 0.5)
            record = _named_alone(work, gen, sick, rf".* {FLIGHT}")
            # The sick node's ranks stood inside the save (torch.distributed.checkpoint).
            frozen = [s for s in record["stacks"] if s["node"] == sick]
            assert frozen and all(
                any("distributed/checkpoint" in f.get("file", "") for f in s["frames"])
                for s in frozen
            ), frozen
            _trains_again_without(work, gen, sick, frozen_at + STEP_TIMEOUT_S)


def test_a_node_that_hangs_in_a_cycles_start_up_is_named_at_its_first_hang(cluster: Cluster):
    # The second hang: a node whose workers stop as they start, frozen here as
    # soon as they are seen, before their process group forms. No collective has run, so
    # no flight recorder has anything to say: the stacks decide alone (docs/hangs.md).
    # They never connect to NVRx's rank monitor; the others' setup timeout ends the cycle.
    flags = ("--train-tasks", "2", "--hot-spares", "1", "--cold-spares", "0", "--depth", "1",
             "--setup-timeout", str(SETUP_TIMEOUT_S))  # fmt: skip
    with _chain(cluster, "hang-start", *flags) as (work, _name, [gen]):
        info = work / "nvrx" / gen / "cycle_infos" / f"cycle_info.{gen}.0.0"
        wait_in(work, lambda: info.exists() and cycle_info(info.read_text()), CYCLE_S,
                "cycle 0's rendezvous")  # fmt: skip
        active, _ = cycle_nodes(work, gen, 0)
        (sick,) = active - {_node_of_task0(work, gen)}
        with Freezer(work, {sick}, at_start=True) as freezer:
            frozen_at = Cluster.wait_until(freezer.first, CYCLE_S, "a worker frozen", 0.5)
            # Frozen in their imports, or a moment later; the others form the group.
            _named_alone(work, gen, sick, "`init_process_group`")
            _trains_again_without(work, gen, sick, frozen_at + SETUP_TIMEOUT_S)
            assert not [e for e in progress(work) if e.get("cycle") == 0 and e["event"] == "step"]


def test_a_node_whose_workers_are_stuck_in_the_kernel_is_named_at_its_first_hang(
    cluster: Cluster,
):
    # The state-D case: one node's workers frozen by the cgroup freezer (a driver
    # call that never returns); py-spy cannot read them, their samples say so with their
    # state, and the others' flight recorders say whom they wait for.
    pytest.importorskip("nvrx_appliance.rank.sampler", reason="needs unreadable samples")
    flags = ("--train-tasks", "2", "--hot-spares", "1", "--cold-spares", "0", "--depth", "1")
    with _chain(cluster, "hang-d", *flags) as (work, _name, [gen]):
        started_in_cycle(work, gen, 0, CYCLE_S)
        active, _ = cycle_nodes(work, gen, 0)
        (sick,) = active - {_node_of_task0(work, gen)}
        with Freezer(work, {sick}, kernel=True):
            record = _hang_record(work, gen, 0)
            assert record["verdict"] == "hung" and record["nodes"] == [sick], _read(record)
            # The kernel says where it keeps them (/proc/<pid>/wchan: where the freezer
            # caught them, `hrtimer_nanosleep` in one run), no file system's wait, for
            # longer than the still time (issue 53, finding 4).
            assert re.match(
                rf"{sick} hung in cycle 0: its 2 ranks stuck in the kernel \(state D at `\w+`\)",
                record["words"],
            ), record["words"]
            assert "(flight recorder: rank(s) " in record["words"]
            started_in_cycle(work, gen, 1, CYCLE_S)
            assert sick not in cycle_nodes(work, gen, 1)[0], logs_on_failure(work)


# The repeated stall's settings: a shorter sampling period lets shorter timeouts still
# leave the stacks their two periods to call a rank still (submit's floor: three periods).
STALL_PERIOD_S = 2
STALL_TIMEOUT_S = 10


def test_a_ranks_repeated_stall_in_the_scripts_own_code_names_no_node_and_stops_in_true_words(
    cluster: Cluster,
):
    # The issue's W&B case, repeated (issue 53, finding 2): the last rank (not on task 0's
    # node) stands 100 s in its own `upload_metrics` at iteration 45, every time it gets
    # there, outside NVRx's step section, while the others wait in the script's
    # all_reduce; NVRx's out-of-section timeout ends each cycle, and its no-progress rule
    # (1 cycle here) stops the chain with 93. No node may be named or kept out: node
    # memory once counted those kills as the node's failures and excluded it for 24 h.
    flags = ("--train-tasks", "2", "--hot-spares", "0", "--cold-spares", "0", "--depth", "2",
             "--max-no-progress-cycles", "1", "--exclude-after-failures", "1",
             "--stack-sampling", str(STALL_PERIOD_S), "--step-timeout", str(STALL_TIMEOUT_S),
             "--out-of-section-timeout", str(STALL_TIMEOUT_S))  # fmt: skip
    work, name = cluster.workdir("stall"), unique("stall")
    args = cluster.work_root / f"{name}.args"
    args.write_text("--progress\n--iterations 10000000\n--step-seconds 0.1\n--stall-at\n45:3:100\n")
    workload = ("--workload", "script", "--script", str(SCRIPT), "--script-args", str(args))
    [gen, _] = submit(cluster, work, name, *workload, "--save-interval", "20", *flags)
    try:
        started_in_cycle(work, gen, 0, CYCLE_S)
        task0 = _node_of_task0(work, gen)
        records = [_hang_record(work, gen, cycle) for cycle in (0, 1)]
        for cycle, record in enumerate(records):
            assert record["verdict"] == "workload" and record["nodes"] == [], _read(record)
            [(node, ranks)] = record["stalled"].items()
            assert node != task0 and ranks == [3], record["stalled"]
            words = record["words"]
            assert words.startswith(
                f"the workload stalled in cycle {cycle}: rank 3 on {node} stood in its own code "
                "in `upload_metrics` (state S) while the 3 others waited in `all_reduce` for it; "
                "flight recorder: rank(s) 0, 1, 2 waited in `gloo:all_reduce` #"
            ), words
            assert words.endswith(
                "no node is at fault, none is kept out; NVRx's timeout ended the ranks; if that "
                "work is the workload's (a save, an evaluation, an upload), raise the timeout or "
                "open NVRx's checkpointing section around it"
            ), words
        [entry] = wait_ledger(work, 1, CYCLE_S)
        reason = entry["reason"]
        assert reason.startswith(
            "ft_launcher exited 93: NVRx decided not to restart after the workload failed 2 "
            f"times, each time a timeout ended its own stall (rank 3 on {node} stood in its own "
            "code in `upload_metrics` (state S)), which names no node"
        ), entry
        # No node named or kept out, by any judge: the hang rule, node memory, stragglers.
        hangs = work / "nvrx" / gen / "hangs"
        assert not list(hangs.glob("hung.*")) and not list(hangs.glob("withdrawn.*"))
        assert not entry.get("excluded"), entry
        kept = [e for e in json_lines(work / "exclusions.jsonl") if e.get("kind") == "excluded"]
        assert kept == [], kept
        assert not list((work / "nvrx" / gen / "stragglers").glob("named.*"))
        status = " ".join(cli(cluster, "status", name).stdout.split())
        assert "ft_launcher exited 93: NVRx decided not to restart after the workload failed 2 " \
            "times, each time a timeout ended its own stall" in status, status  # fmt: skip
        assert records[1]["words"] in cli(cluster, "logs", name, "--stacks").stdout
    finally:
        cli(cluster, "cancel", name)
        wait_idle(cluster, name, timeout=120)


FLIGHT = (  # the words' flight-recorder part, as a regular expression
    r"\(flight recorder: rank\(s\) \d, \d waited in `gloo:[a-z_]+` #\d+ of process group 0 "
    r"for rank\(s\) \d, \d\)"
)


def _named_alone(work: Path, gen: str, sick: str, waited: str) -> dict:
    """Cycle 0's hang record, which names `sick` alone: its 2 ranks stopped, the 2 others
    waited in `waited` (a regular expression for the rest of the words)."""
    record = _hang_record(work, gen, 0)
    assert record["verdict"] == "hung" and record["nodes"] == [sick], _read(record)
    assert re.fullmatch(
        rf"{sick} hung in cycle 0: its 2 ranks stopped in `[^`]+`( / `[^`]+`)* while the 2 "
        rf"others waited in {waited}",
        record["words"],
    ), record["words"]
    return record


def _read(record: dict) -> str:
    """The words, and what each rank's last sample said when they were judged."""
    judged = datetime.datetime.fromisoformat(record["time"]).timestamp()
    lines = [record["words"]]
    for s in record.get("stacks", []):
        age, still = judged - float(s.get("epoch", 0)), judged - float(s.get("still_since", 0))
        unreadable = f", unreadable: {s['unreadable']}" if s.get("unreadable") else ""
        lines.append(
            f"  rank {s.get('rank')} on {s.get('node')}: state {s.get('state')}, {age:.1f} s old, "
            f"still {still:.1f} s, {len(s.get('frames') or [])} frames{unreadable}"
        )
    return "\n".join(lines)


def _trains_again_without(work: Path, gen: str, sick: str, timed_out_by: float) -> None:
    """Named at its first hang: cycle 1 starts without the node, within the section's
    timeout (`timed_out_by`) and one in-job restart."""
    started = started_in_cycle(work, gen, 1, CYCLE_S)
    assert sick not in cycle_nodes(work, gen, 1)[0], logs_on_failure(work)
    assert started["time"] - timed_out_by < CYCLE_S


def _excluded(cluster: Cluster, name: str, task: int) -> list[str]:
    """The nodes an array task of the chain excludes, as squeue shows them."""
    out = cluster.slurm("squeue", "-h", "-r", "--name", name, "-o", "%K|%x").stdout
    rows = dict(line.split("|", 1) for line in out.split())
    excluded = rows.get(str(task), "(null)")
    return [] if excluded == "(null)" else expand_nodelist(excluded)


def _node_of_task0(work: Path, gen: str) -> str:
    """Task 0's node, as its rendezvous record names it."""
    record = json.loads((work / "nvrx" / gen / "control" / "rdzv.json").read_text())
    return str(record["host"]).split(".", 1)[0]
