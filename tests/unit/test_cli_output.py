"""What each command prints for a person, for every kind of value it can be given: the
train mode and the two demo modes, fields nothing has filled yet, a chain Slurm has
forgotten. The same commands run on the real cluster in tests/integration/test_cli_cluster.py.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from nvrx_appliance import api
from nvrx_appliance.chain import status
from nvrx_appliance.cli import chain as commands
from nvrx_appliance.cli import status_view
from nvrx_appliance.observe import slurm_output
from nvrx_appliance.observe.times import parse_time

WORK = "/shared/alice/run"


@pytest.fixture(autouse=True)
def no_slurm(tmp_path, monkeypatch):
    # A plan reviewed anywhere: Slurm out of reach, so its checks are skipped.
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none"))


def plan_for(**settings) -> api.SubmitPlan:
    settings = {"workload": "cpu", **settings}
    spec = api.chain_spec(environ={}, work_dir=WORK, job_name="gpt", **settings)
    return api.prepare(spec, dry_run=True)


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("train", "train (no injected faults)"),
        ("no-restart", "no-restart demo (injects faults)"),
        ("handoff", "handoff demo (injects faults)"),
    ],
)
def test_a_queued_chain_says_what_was_queued_its_mode_and_how_to_follow_it(mode, said):
    plan = plan_for(mode=mode, depth=3, train_tasks=2, hot_spares=1, cold_spares=2)
    lines = commands.submitted_lines(api.Submitted(["101", "102", "103"], plan))
    assert lines == [
        "Queued chain 'gpt': 3 generation(s) of array 0-4%3 (2 training + 1 hot + 2 cold spare "
        "tasks)",
        f"  mode:     {said}",
        "  jobs:     101 102 103",
        f"  work dir: {WORK}",
        "  follow:   nvrx-appliance status 101",
    ]


def test_a_demo_without_a_workload_fault_says_so():
    plan = plan_for(mode="handoff", fault_inject=False)
    assert commands.mode_line(plan.manifest) == "handoff demo (no workload fault)"


def test_a_dry_run_shows_the_mode_the_ranks_command_the_sbatch_lines_and_the_script():
    plan = plan_for(depth=2)
    text = commands.dry_run_text(plan)
    lines = text.splitlines()
    assert lines[0] == "# dry run: nothing was written or submitted"
    assert lines[1] == "# mode: train (no injected faults)"
    assert lines[2] == (
        "# shape: 16 ranks = TP 1 x PP 1 x CP 1 x DP 16 (experts: EP 1 x ETP 1); "
        "global batch 16 = micro 1 x DP 16 x 1 microbatches"
    )
    assert lines[3] == "# W&B run: none (the workload is given no --wandb-project)"
    assert "nvrx_appliance.workloads.cpu" in lines[5]
    assert lines[6] == lines[7] and lines[6].startswith("sbatch --job-name=gpt ")
    assert lines[8] == f"# ---- {WORK}/gpt.sbatch ----"
    assert text.endswith(plan.script)


def test_a_dry_run_shows_the_parallel_shape_every_size_and_the_chains_wandb_run(tmp_path):
    (tmp_path / "pretrain_gpt.py").write_text("")  # a Megatron-LM checkout, as far as submit looks
    args = ["--wandb-project", "p", "--wandb-exp-name", "x", "--num-experts", "4"]
    plan = plan_for(workload="megatron", megatron_path=str(tmp_path), train_tasks=4,
                    gpus_per_node=8, tensor_parallel=4, context_parallel=2, expert_parallel=2,
                    global_batch=8, train_samples=800, megatron_args=args)  # fmt: skip
    lines = commands.dry_run_text(plan).splitlines()
    assert lines[2] == (
        "# shape: 32 ranks = TP 4 x PP 1 x CP 2 x DP 4 (experts: EP 2 x ETP 4); "
        "global batch 8 = micro 1 x DP 4 x 2 microbatches"
    )
    run_id = plan.manifest.wandb_run_id
    assert run_id and lines[3] == f"# W&B run: {run_id} (every generation and restart logs to it)"


def test_cancel_says_what_it_cancelled_or_that_nothing_lived():
    both = api.Cancelled(job_name="gpt", running=("101",), queued=("102", "103"))
    assert commands.cancelled_line(both) == ("Cancelled chain 'gpt': running 101; queued 102, 103")
    queued_only = api.Cancelled(job_name="gpt", running=(), queued=("102",))
    assert commands.cancelled_line(queued_only) == "Cancelled chain 'gpt': running none; queued 102"
    gone = api.Cancelled(job_name="gpt", running=(), queued=())
    assert commands.cancelled_line(gone) == (
        "Nothing of chain 'gpt' was queued or running; marked it ended"
    )


# ---- status, as rich renders it ----

MANIFEST = {
    "created": "2026-11-30T18:00:00Z",
    "user": "alice",
    "spec": {"job_name": "gpt", "work_dir": WORK, "time_limit": "01:00:00", "mode": "train"},
    "shape": {"array_spec": "0-2%2", "active_tasks": 2},
}
LEDGER = [
    {"array_job_id": "500", "chain": "2026-11-30T18:00:00Z", "task0_node": "node1",
     "exit_code": 1, "checkpoint_iteration_start": None, "checkpoint_iteration": 40,
     "action": "released_spares"},
    {"array_job_id": "501", "chain": "2026-11-30T18:00:00Z", "task0_node": "node2",
     "exit_code": 0, "checkpoint_iteration_start": 40, "checkpoint_iteration": 80,
     "action": "released_spares"},
]  # fmt: skip


def rendered(view: status.ChainView) -> str:
    console = Console(file=io.StringIO(), width=220, record=True)
    console.print(status_view.render(view))
    return console.export_text()


def assembled(manifest=MANIFEST, queue="", acct="", ledger=(), checkpoint_now=None, **kw):
    return status.assemble(
        manifest=manifest,
        queue=None if queue is None else slurm_output.squeue_tasks(queue),
        acct=None if acct is None else slurm_output.sacct_rows(acct),
        ledger=list(ledger), cycles={}, checkpoint_now=checkpoint_now, chain_marker=False,
        now=parse_time("2026-11-30T19:00:00"), **kw,
    )  # fmt: skip


def row(text: str, generation: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith(f"│ {generation}"))


def test_a_chain_slurm_has_forgotten_is_read_from_its_ledger_one_row_per_generation():
    text = rendered(assembled(ledger=LEDGER, checkpoint_now=80))
    assert "chain gpt" in text and "mode: train   workload:" in text
    assert "checkpoint iteration now: 80" in text and "queued generations: none" in text
    first, second = row(text, "500"), row(text, "501")
    assert "node1" in first and "│ 1 " in first and "released spares" in first
    assert "node2" in second and "│ 40 " in second and "│ 80 " in second


def test_a_chain_just_queued_shows_dashes_for_what_nothing_has_filled_yet():
    manifest = {**MANIFEST, "spec": {**MANIFEST["spec"], "mode": "handoff"}}
    queue = f"700_0|700|0|gpt|alice|PENDING|(null)|Dependency|{WORK}\n"
    text = rendered(assembled(manifest=manifest, queue=queue))
    assert "mode: handoff (demo)" in text
    assert "checkpoint iteration now: -" in text and "queued generations: 700" in text
    line = row(text, "700")
    assert "queued (Dependency)" in line
    # No node, no start, no exit, no checkpoints, no teardown yet.
    assert line.count(" - ") >= 6, line


def test_status_with_slurm_unreachable_says_so_above_the_work_dirs_record():
    blind = ["squeue: timed out", "sacct: timed out"]
    text = rendered(assembled(queue=None, acct=None, ledger=LEDGER, blind=blind))
    assert text.splitlines()[0] == (
        "unknown: Slurm could not be reached; below is what the work dir records"
    )
    assert "could not read squeue: timed out" in text
    assert "500" in text and "501" in text
