"""The operator's view, as a person types it: the list of chains, one way to name a
chain in every command (the watcher's too), the line status opens with, and output
that stays whole through a pipe and on a narrow terminal.

Slurm is the file-backed stand-in (slurm_standin.py), first on PATH: these cases need
chains of several states, users and names at once, which the real cluster would take
minutes to make; tests/integration/test_cli_cluster.py runs the same commands on it.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
from pathlib import Path

import pytest

from nvrx_appliance.chain import submit
from nvrx_appliance.cli import watch as watch_cli

from .slurm_standin import SlurmStandin
from .test_submit_rollback import CLI, make_plan
from .test_submit_rollback import shared_dir as shared_dir  # a fixture

NODE = "gpu-node-with-a-long-name-0042"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A command as a person runs it with its output piped (`| less`, a CI log)."""
    return subprocess.run(
        [CLI, *args], capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def on_a_terminal(*args: str, columns: int = 80) -> str:
    """A command run on a pseudo-terminal `columns` wide; what it showed."""
    master, replica = pty.openpty()
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "xterm"}
    proc = subprocess.Popen([CLI, *args], stdin=replica, stdout=replica, stderr=replica, env=env)
    os.close(replica)
    seen = b""
    while True:
        ready = select.select([master], [], [], 30)[0]
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the command ended and closed its side
            break
        if not chunk:
            break
        seen += chunk
    proc.wait(timeout=30)
    os.close(master)
    return seen.decode(errors="replace")


def chain(slurm: SlurmStandin, tmp_path: Path, name: str, depth: int = 2) -> tuple[Path, list]:
    """A chain queued by submit into its own work dir: its work dir and job ids."""
    before = {j["id"] for j in slurm.jobs()}
    plan = make_plan(tmp_path / name, depth=depth, job_name=name)
    submit.submit(plan)
    return Path(plan.manifest.spec.work_dir), [
        j["id"] for j in slurm.jobs() if j["id"] not in before
    ]


def ledger(work: Path, *entries: dict) -> None:
    with (work / "chain.jsonl").open("a") as fh:
        for entry in entries:
            fh.write(json.dumps({"chain": "c", "exit_code": 1, **entry}) + "\n")


def run_one(slurm: SlurmStandin, job_id: str) -> None:
    slurm.update(job_id, state="RUNNING", nodes=NODE, start="2026-12-03T06:00:00")


def end(slurm: SlurmStandin, job_id: str, state: str = "FAILED") -> None:
    slurm.update(job_id, state=state, nodes=NODE, start="2026-12-03T06:00:00",
                 end="2026-12-03T06:10:00", exit_code="1:0")  # fmt: skip


# ---- the list of chains -------------------------------------------------------------------


def test_status_without_a_chain_lists_each_of_yours_on_one_line_in_words(slurm, tmp_path):
    running, (first, _) = chain(slurm, tmp_path, "llama-pretrain")
    run_one(slurm, first)
    (running / "checkpoints").mkdir(exist_ok=True)
    (running / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("1200\n")
    demo, (one, two) = chain(slurm, tmp_path, "demo-handoff")
    end(slurm, one)
    end(slurm, two)
    ledger(demo, {"array_job_id": one, "action": "released_spares"},
           {"array_job_id": two, "action": "released_spares"})  # fmt: skip
    slurm.add("900", "not-a-chain", str(tmp_path), "RUNNING")  # no run.json in its work dir
    slurm.add("901", "bobs-chain", str(tmp_path / "bob"), "RUNNING", user="bob")

    listed = run("status")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == [
        "chain", "state", "generation", "checkpoint", "goodput", "work", "dir"
    ]  # fmt: skip
    # The newest chain first; every value whole, however long.
    assert lines[1].split() == ["demo-handoff", "ended:", "exhausted", two, "-", "0%", str(demo)]
    assert lines[2].split()[:5] == ["llama-pretrain", "running", first, "1200", "0%"]
    assert lines[2].split()[-1] == str(running)
    assert "1 other job(s) left out: their work dir holds no run.json you can read" in lines
    assert "bobs-chain" not in listed.stdout and "…" not in listed.stdout


def test_the_list_asks_slurm_twice_whatever_the_number_of_chains(slurm, tmp_path):
    def calls() -> int:
        return len(slurm.calls("squeue")) + len(slurm.calls("sacct"))

    chain(slurm, tmp_path, "one")
    before = calls()
    assert run("status").returncode == 0
    with_one = calls() - before
    for name in ("two", "three", "four", "five"):
        chain(slurm, tmp_path, name)
    before = calls()
    listed = run("status")
    assert listed.stdout.count(" queued ") == 5, listed.stdout
    assert with_one == calls() - before == 2


def test_all_lists_every_users_chains_with_their_owner_and_json_says_the_same(slurm, tmp_path):
    mine, _ = chain(slurm, tmp_path, "mine")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    doc = json.loads((mine / "run.json").read_text())
    doc["spec"].update(job_name="bobs", work_dir=str(theirs))
    (theirs / "run.json").write_text(json.dumps(doc))
    slurm.add("950", "bobs", str(theirs), "PENDING", user="bob")
    listed = run("status", "--all")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()[1:]}
    assert rows["bobs"][1:3] == ["bob", "queued"] and rows["mine"][1:3] == ["alice", "queued"]
    doc = json.loads(run("status", "--all", "--json").stdout)
    assert doc["schema"] == "nvrx-appliance/chains"
    found = {c["job_name"]: c for c in doc["chains"]}
    assert found["bobs"]["owner"] == "bob" and found["bobs"]["state"] == "queued"
    assert found["mine"]["generation"] and found["mine"]["work_dir"] == str(mine)


def test_no_chains_says_so_and_where_an_older_one_is_read(slurm):
    listed = run("status")
    assert listed.returncode == 0
    assert "no chains of yours in squeue or in sacct's last 30 days" in listed.stdout


# ---- one way to name a chain --------------------------------------------------------------


@pytest.mark.parametrize("command", ["status", "logs", "report", "cancel"])
def test_a_name_that_matches_nothing_says_so_and_lists_the_near_names(slurm, tmp_path, command):
    chain(slurm, tmp_path, "llama-pretrain")
    chain(slurm, tmp_path, "llama-finetune")
    done = run(command, "llama-pretrian")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("nvrx-appliance: no chain 'llama-pretrian' of user alice")
    assert "near names: llama-pretrain, llama-finetune" in done.stderr
    assert slurm.calls("scancel") == []


@pytest.mark.parametrize("command", ["status", "logs", "report"])
def test_every_command_takes_a_name_any_job_id_or_the_work_dir(slurm, tmp_path, command):
    work, (first, second) = chain(slurm, tmp_path, "gpt")
    end(slurm, first)
    (work / "logs" / f"slurm-gpt-{first}_0.out").write_text("task 0 said this\n")
    for target in (["gpt"], [first], [second], ["--work-dir", str(work)]):
        done = run(command, *target, *(["--no-svg"] if command == "report" else []))
        assert "Traceback" not in done.stderr and "no chain" not in done.stderr, (target, done)
        if command == "logs" and target == [second]:  # a job id means its own generation
            assert f"generation {second} (" in done.stderr and "does not exist yet" in done.stderr
        elif command == "logs":
            assert done.stdout == "task 0 said this\n", (target, done.stderr)
        if command == "status":
            assert done.stdout.startswith("running") or done.stdout.startswith("queued"), target


def test_the_watcher_finds_a_chain_by_name_as_every_command_does(slurm, tmp_path):
    work, (first, second) = chain(slurm, tmp_path, "gpt")
    run_one(slurm, first)
    options = {"job_id": "gpt", "job_name": "", "work_dir": "", "user": "", "platform": "slurm"}
    # A name means the chain's newest generation; a job id, itself.
    assert watch_cli._chain(options) == (second, "gpt", str(work))
    assert watch_cli._chain({**options, "job_id": first}) == (first, "gpt", str(work))
    # A chain the appliance did not submit (no run.json where Slurm ran it: the reference
    # deployment's own sbatch): its Slurm work dir is no appliance work dir, and the
    # watcher finds its files from its batch script.
    slurm.add("900", "reference-chain", str(tmp_path), "RUNNING")
    assert watch_cli._chain({**options, "job_id": "900"}) == ("900", "reference-chain", "")
    typo = subprocess.run([str(Path(CLI).parent / "nvrx-watch"), "gtp", "--dry-run"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert typo.returncode == 2 and "near names: gpt" in typo.stderr, typo.stderr
    assert "blind" not in typo.stderr and "Traceback" not in typo.stderr


# ---- the line status opens with -----------------------------------------------------------


def test_status_of_a_chain_cancelled_with_a_plain_scancel_says_so_and_what_never_ran(
    slurm, tmp_path
):
    # `scancel -n NAME`, a common habit, leaves the chain marker: status said "exhausted,
    # every generation queued has run" though two of three never ran (seen on 10 chains).
    work, (one, two, three) = chain(slurm, tmp_path, "gpt", depth=3)
    slurm.update(one, state="CANCELLED by 0", nodes=NODE, start="2026-12-03T06:00:00",
                 end="2026-12-03T06:10:00", exit_code="0:15")  # fmt: skip
    ledger(work, {"array_job_id": one, "action": "released_spares"})
    for never in (two, three):
        slurm.update(never, state="CANCELLED by 0")
    shown = run("status", "gpt")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == (
        f"ended: cancelled by root (uid 0), checkpoint iteration none yet; 2 generation(s) "
        f"never ran ({two}, {three})"
    )
    lead = json.loads(run("status", "gpt", "--json").stdout)["headline"]
    assert (lead["state"], lead["why"]) == ("ended", "cancelled")


def test_status_of_an_exhausted_chain_says_it_ended_why_and_what_to_run(slurm, tmp_path):
    work, (one, two) = chain(slurm, tmp_path, "demo")
    end(slurm, one)
    end(slurm, two)
    ledger(work, {"array_job_id": one, "action": "released_spares"},
           {"array_job_id": two, "action": "released_spares"})  # fmt: skip
    shown = run("status", "demo")
    assert shown.returncode == 0, shown.stderr
    first, then = shown.stdout.splitlines()[:2]
    assert first == (
        "ended: exhausted, every generation queued has run and none is left; "
        "checkpoint iteration none yet"
    )
    assert then == f"next: nvrx-appliance submit --work-dir {work} --job-name demo <its settings>"
    lead = json.loads(run("status", "demo", "--json").stdout)["headline"]
    assert (lead["state"], lead["why"]) == ("ended", "exhausted")
    assert lead["text"] == first and then == f"next: {lead['next_command']}"


@pytest.mark.parametrize(
    ("action", "reason", "said", "next_command"),
    [
        ("cancelled_chain", "ft_launcher exited 93", "ended: stopped by NVRx (generation {g}): "
         "ft_launcher exited 93 (do not restart)", "nvrx-appliance logs demo --launcher"),
        # NVRx's 93 answering a workload that failed the same way again and again (issue
        # 29): the headline says what the workload did.
        ("cancelled_chain", "ft_launcher exited 93: NVRx decided not to restart after the "
         "workload failed 4 times at iteration 60 with exit 1: the workload exited 1; "
         "cancelling every queued generation of the chain",
         "ended: stopped by NVRx (generation {g}): ft_launcher exited 93: NVRx decided not to "
         "restart after the workload failed 4 times at iteration 60 with exit 1: the workload "
         "exited 1", "nvrx-appliance logs demo --launcher"),
        ("burn_guard", "2 generations", "ended: stopped by the burn guard (generation {g}): "
         "generations ended without training, checkpoint iteration none yet",
         "nvrx-appliance logs demo"),
        # A workload verdict (issue 29's teardown), and an action no version here knows:
        # read from the action's name and the teardown's reason.
        ("stopped_by_workload", "Megatron exited 17: result validation failed",
         "ended: stopped by the workload (generation {g}): Megatron exited 17: result "
         "validation failed", "nvrx-appliance logs demo"),
        ("quarantined_by_site_policy", "the site's policy said so",
         "ended: quarantined by site policy (generation {g}): the site's policy said so",
         "nvrx-appliance logs demo"),
    ],
)  # fmt: skip
def test_a_chain_the_teardown_ended_says_who_ended_it(
    slurm, tmp_path, action, reason, said, next_command
):
    work, (one, two) = chain(slurm, tmp_path, "demo")
    end(slurm, one)
    slurm.update(two, state="CANCELLED")
    ledger(work, {"array_job_id": one, "action": action, "reason": reason})
    (work / "chain.active").unlink()
    lines = run("status", "demo").stdout.splitlines()
    assert lines[:2] == [said.format(g=one), f"next: {next_command}"]


def test_a_chain_that_went_on_after_an_unknown_action_and_ran_out_is_exhausted(slurm, tmp_path):
    # The teardown keeps the chain marker for an action after which the chain goes on
    # (issue 29's resume_elsewhere, say); nothing left queued then is an exhausted chain.
    work, (one, two) = chain(slurm, tmp_path, "demo")
    end(slurm, one)
    end(slurm, two)
    ledger(work, {"array_job_id": two, "action": "resume_somewhere_new", "reason": "moved"})
    assert run("status", "demo").stdout.startswith("ended: exhausted, ")
    listed = run("status").stdout.splitlines()[1].split()
    assert listed[:3] == ["demo", "ended:", "exhausted"]


def test_a_cancelled_and_a_completed_chain_say_so(slurm, tmp_path):
    work, (one, two) = chain(slurm, tmp_path, "demo")
    assert run("cancel", "demo").returncode == 0
    assert run("status", "demo", "--work-dir", str(work)).stdout.startswith(
        f"ended: cancelled, checkpoint iteration none yet; 2 generation(s) never ran ({one}, "
        f"{two})\n"
    )
    ledger(work, {"array_job_id": one, "action": "completed", "final_iteration": 500})
    lines = run("status", "--work-dir", str(work)).stdout.splitlines()
    assert lines[:2] == ["ended: completed, training reached iteration 500",
                         "next: nvrx-appliance report demo"]  # fmt: skip


# ---- readable without a terminal, and on a narrow one -------------------------------------


def test_status_through_a_pipe_shows_every_id_node_and_time_whole(slurm, tmp_path):
    work, (first, second) = chain(slurm, tmp_path, "a-chain-with-a-rather-long-name")
    end(slurm, first)
    ledger(work, {"array_job_id": first, "action": "released_spares", "task0_node": NODE,
                  "reason": "task 0 exited 1"})  # fmt: skip
    shown = run("status", "a-chain-with-a-rather-long-name")
    assert shown.returncode == 0, shown.stderr
    assert "…" not in shown.stdout
    row = next(line for line in shown.stdout.splitlines() if line.startswith(f"│ {first} "))
    assert NODE in row and "12-03 06:00" in row and "released spares" in row
    assert f"queued generations: {second}" in shown.stdout


def test_status_on_a_narrow_terminal_folds_values_instead_of_cutting_them(slurm, tmp_path):
    work, (first, second) = chain(slurm, tmp_path, "a-chain-with-a-rather-long-name")
    end(slurm, first)
    ledger(work, {"array_job_id": first, "action": "released_spares", "task0_node": NODE})
    shown = on_a_terminal("status", "a-chain-with-a-rather-long-name", columns=80)
    assert "generations" in shown and first in shown and second in shown
    assert "…" not in shown
    # Nothing cut at the right edge either: the last column and the caption's end are there.
    assert "hand-off" in shown and "rele" in shown and "spar" in shown  # folded, not cut
    listed = on_a_terminal("status", columns=60)
    assert "…" not in listed and second in listed and "0%" in listed


# ---- a hand-edited run.json, a lock dir that cannot be made --------------------------------


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda doc: doc["spec"].pop("job_name"), "has no str `spec.job_name`"),
        (lambda doc: doc.update(spec="gpt"), "has no `spec` object"),
    ],
)
def test_a_hand_edited_run_json_is_one_line_and_cancel_still_ends_the_chain(
    slurm, tmp_path, edit, said
):
    work, ids = chain(slurm, tmp_path, "gpt")
    doc = json.loads((work / "run.json").read_text())
    edit(doc)
    (work / "run.json").write_text(json.dumps(doc))
    for command in (["status", "gpt"], ["logs", "gpt"], ["report", "gpt", "--no-svg"]):
        done = run(*command)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert said in done.stderr and "was it edited by hand?" in done.stderr
        assert "`nvrx-appliance cancel gpt` still ends the chain" in done.stderr
    by_dir = run("cancel", "--work-dir", str(work))
    assert by_dir.returncode == 2 and "name the chain (its name or a job id)" in by_dir.stderr
    cancelled = run("cancel", "gpt")
    assert cancelled.returncode == 0, cancelled.stderr
    assert (
        cancelled.stdout.strip() == f"Cancelled chain 'gpt': running none; queued {', '.join(ids)}"
    )
    assert slurm.live() == []
    listed = run("status")
    assert f"gpt: {work}/run.json {said}" in listed.stdout


def test_a_lock_dir_that_cannot_be_made_fails_submit_cleanly_with_nothing_submitted(
    slurm, tmp_path, shared_dir
):
    in_the_way = tmp_path / "state-is-a-file"
    in_the_way.write_text("")
    work = shared_dir / "run"
    done = run("submit", "--work-dir", str(work), "--workload", "cpu", "--runtime", "bare",
               env={"XDG_STATE_HOME": str(in_the_way)})  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "nothing was written or queued: cannot make the submit lock" in done.stderr
    assert "set XDG_STATE_HOME" in done.stderr
    assert slurm.calls("sbatch") == [] and not (work / "run.json").exists()
