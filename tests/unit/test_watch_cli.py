"""`nvrx-watch` as a person or cron runs it: flags and their NVRX_WATCH_* variables, exit
codes, how a job id becomes a run, and what the watcher writes (never the job's files)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from nvrx_appliance import __version__, manifest
from nvrx_appliance.cli.watch import watch
from nvrx_appliance.devcluster.poll import wait_until
from nvrx_appliance.settings.chain import ChainSpec
from nvrx_appliance.watch import detectors, persistence, target
from nvrx_appliance.watch import run_loop as watch_shell
from nvrx_appliance.watch.config import Settings, Thresholds
from nvrx_appliance.watch.findings import Run
from nvrx_appliance.watch.platform import SlurmPlatform, SlurmUnavailable
from nvrx_appliance.watch.readers import CycleReader
from nvrx_appliance.watch.run_loop import build

FIXTURES = Path(__file__).parent / "fixtures" / "watch"


def killed_run(root: Path) -> Path:
    work = root / "run"
    target = work / "nvrx" / "4343" / "cycle_infos"
    target.mkdir(parents=True)
    for item in (FIXTURES / "killed").iterdir():
        shutil.copy(item, target / item.name, follow_symlinks=False)
    return work


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(watch, list(args), env=env, catch_exceptions=False)


def test_list_detectors_names_every_detector_and_its_thresholds():
    result = invoke("--list-detectors")
    assert result.exit_code == 0
    for name in detectors.NAMES:
        assert name in result.output
    assert "--grace 120s:" in result.output


def test_an_unknown_detector_in_disable_is_refused_naming_the_valid_ones():
    result = invoke(
        "--disable", "orphaned_generation,nope", "--platform", "none", "--work-dir", "/x"
    )
    assert result.exit_code == 2
    assert "unknown detector(s) nope; choose from orphaned_generation" in result.output


def test_platform_none_needs_a_place_to_find_cycle_infos():
    result = invoke("--platform", "none")
    assert result.exit_code == 2 and "--platform none needs --work-dir" in result.output


def test_platform_none_with_a_cycle_info_glob_says_what_it_watches(tmp_path):
    work = killed_run(tmp_path)
    glob = f"{work}/nvrx/*/cycle_infos/cycle_info.*"
    result = invoke(
        "--platform", "none", "--cycle-info-glob", glob, "--stall-seconds", "1e9",
        "--state-file", str(tmp_path / "state.json"),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "without Slurm (--platform none: chain detectors off)" in result.output
    assert f"cycle infos: {glob}; checkpoint tracker: none; work dir: none" in result.output
    assert "; from --cycle-info-glob" in result.output and "nowhere" not in result.output
    assert "1 cycle(s)" in result.output


def test_once_and_interval_exclude_each_other(tmp_path):
    result = invoke("--once", "--interval", "60", "--platform", "none", "--work-dir", str(tmp_path))
    assert result.exit_code == 2 and "--once and --interval" in result.output


def test_every_flag_also_reads_its_environment_variable(tmp_path):
    work = killed_run(tmp_path)
    env = {
        "NVRX_WATCH_PLATFORM": "none",
        "NVRX_WATCH_WORK_DIR": str(work),
        "NVRX_WATCH_STATE_FILE": str(tmp_path / "state" / "state.json"),
        "NVRX_WATCH_STALL_SECONDS": "1",
    }
    assert invoke(env=env).exit_code == 2  # the killed cycle is "stalled" after one second
    env["NVRX_WATCH_DISABLE"] = "cycle_stalled"
    assert invoke(env=env).exit_code == 0
    env.pop("NVRX_WATCH_DISABLE")
    env["NVRX_WATCH_STALL_SECONDS"] = str(10**9)
    assert invoke(env=env).exit_code == 0


def test_the_submit_sides_names_are_read_after_the_watchers_own(tmp_path):
    work = killed_run(tmp_path)
    env = {
        "NVRX_WATCH_PLATFORM": "none",
        "NVRX_WATCH_STATE_FILE": str(tmp_path / "state" / "state.json"),
        "NVRX_WATCH_STALL_SECONDS": "1",
        "NVRX_WORK_DIR": str(work),  # as the seeds' deployment and `submit` set them
        "NVRX_JOB_NAME": "llm-7b",
    }
    result = invoke(env=env)
    assert result.exit_code == 2  # the killed cycle was found through NVRX_WORK_DIR
    assert "pass over llm-7b " in result.output
    env |= {"NVRX_WATCH_JOB_NAME": "llm-7b-watched", "NVRX_WATCH_WORK_DIR": str(tmp_path / "no")}
    result = invoke(env=env)
    assert result.exit_code == 0 and "pass over llm-7b-watched " in result.output


def test_a_secret_file_that_cannot_be_read_is_a_usage_error_naming_the_flag(tmp_path):
    result = invoke(
        "--platform", "none", "--work-dir", str(tmp_path),
        "--pagerduty-routing-key-file", str(tmp_path / "missing"),
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--pagerduty-routing-key-file: cannot read" in result.output


def tree(path: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(path)): (p.lstat().st_mtime_ns, p.lstat().st_size)
        for p in sorted(path.rglob("*"))
    } | {".": (path.stat().st_mtime_ns, 0)}


def test_a_pass_never_writes_into_the_jobs_directories(tmp_path):
    work = killed_run(tmp_path)
    (work / "checkpoints").mkdir()
    tracker = work / "checkpoints" / "latest_checkpointed_iteration.txt"
    tracker.write_text("40")
    os.utime(tracker, (1_700_000_000, 1_700_000_000))
    (work / "chain.jsonl").write_text('{"array_job_id": "4343", "exit_code": 1}\n')
    before = tree(work)
    result = invoke(
        "--platform", "none", "--work-dir", str(work), "--stall-seconds", "1",
        "--state-file", str(tmp_path / "state" / "state.json"),
        "--metrics-file", str(tmp_path / "metrics" / "nvrx.prom"),
    )  # fmt: skip
    assert result.exit_code == 2
    assert tree(work) == before


def test_state_is_owner_only_and_a_corrupt_state_file_is_not_an_error(tmp_path):
    work = killed_run(tmp_path)
    state = tmp_path / "state" / "state.json"
    state.parent.mkdir()
    state.write_text("{ not json")
    quiet = ("--stall-seconds", "1e9")  # the recorded open cycle must not age into a finding
    result = invoke(
        "--platform", "none", "--work-dir", str(work), "--state-file", str(state), *quiet
    )
    assert result.exit_code == 0
    assert json.loads(state.read_text())["version"] == 1
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    fresh = tmp_path / "fresh" / "nested" / "state.json"
    invoke("--platform", "none", "--work-dir", str(work), "--state-file", str(fresh), *quiet)
    assert stat.S_IMODE(fresh.parent.stat().st_mode) == 0o700


# --- from a job id to the run -----------------------------------------------------------------


def submitted_run(root: Path, name: str = "chain-a") -> Path:
    """A work dir as `nvrx-appliance submit` leaves it: run.json and the sbatch beside it."""
    work = root / "work"
    spec = ChainSpec(
        job_name=name, work_dir=str(work), runtime="bare", max_restarts=5, train_tasks=3
    )
    manifest.save(manifest.build(spec, created="2026-11-30T00:00:00Z", user="alice"))
    (work / f"{name}.sbatch").write_text("#!/bin/bash\n")
    return work


class Scontrol:
    """scontrol as the cluster printed it for a generation, pointed at a test work dir."""

    def __init__(self, work: Path, command: Path, name: str = "chain-a") -> None:
        text = (FIXTURES / "slurm" / "scontrol_array.txt").read_text().splitlines()[0]
        self.text = (
            text.replace("Command=/shared/work/watch-record/gen.sbatch", f"Command={command}")
            .replace("WorkDir=/shared/work/watch-record", f"WorkDir={work}")
            .replace("JobName=watch-rec-7357", f"JobName={name}")
        )

    def __call__(self, argv, timeout):
        assert argv[0] == "scontrol"
        return self.text


def test_a_job_id_of_a_submitted_chain_resolves_through_its_run_json(tmp_path):
    work = submitted_run(tmp_path)
    platform = SlurmPlatform(run=Scontrol(work, work / "chain-a.sbatch"))
    request = target.Request(job_id="18")
    info = target.identify(request, platform, "alice", {})
    run, notes = target.locate(request, info)
    assert (run.job_name, run.owner, run.work_dir) == ("chain-a", "root", str(work))
    assert run.cycle_glob == f"{work}/nvrx/*/cycle_infos/cycle_info.*"
    assert run.tracker == str(work / "checkpoints" / "latest_checkpointed_iteration.txt")
    assert (run.max_restarts, run.train_tasks) == (5, 3)
    assert run.origin.startswith("run.json") and notes == []


def test_a_run_json_of_another_chain_is_not_taken(tmp_path):
    work = submitted_run(tmp_path, name="other")
    platform = SlurmPlatform(run=Scontrol(work, work / "x.sbatch", name="chain-a"))
    request = target.Request(job_id="18")
    run, notes = target.locate(request, target.identify(request, platform, "alice", {}))
    assert run.max_restarts is None
    assert any("belongs to chain other" in n for n in notes)


def test_a_chain_not_submitted_by_us_resolves_from_its_batch_script(tmp_path):
    script = tmp_path / "cell.sbatch"
    script.write_text(
        'ROOT=/lustre/alice/exp\nft_launcher --ft-cycle-info-dir "$ROOT/nvrx/$SLURM_ARRAY_JOB_ID" '
        "--ft-checkpoint-iteration-file $ROOT/ckpt/it.txt x.py\n"
    )
    platform = SlurmPlatform(run=Scontrol(tmp_path, script))
    request = target.Request(job_id="18", max_restarts=7)
    run, _ = target.locate(request, target.identify(request, platform, "alice", {}))
    assert run.cycle_glob == "/lustre/alice/exp/nvrx/*/cycle_info.*"
    assert run.tracker == "/lustre/alice/exp/ckpt/it.txt"
    assert run.max_restarts == 7 and run.origin == f"batch script {script}"


def test_flags_override_what_the_script_says(tmp_path):
    script = tmp_path / "cell.sbatch"
    script.write_text("ft_launcher --ft-cycle-info-dir /a/ci x.py\n")
    platform = SlurmPlatform(run=Scontrol(tmp_path, script))
    request = target.Request(job_id="18", cycle_info_glob="/b/*/cycle_info.*", job_name="renamed")
    run, _ = target.locate(request, target.identify(request, platform, "alice", {}))
    assert (run.cycle_glob, run.job_name) == ("/b/*/cycle_info.*", "renamed")


CELL = r"""#!/bin/bash
#SBATCH --dependency=singleton
# Inside the job $0 is slurmd's spooled copy: ask Slurm where this file really lives.
CELL_DIR=$(dirname "$(scontrol show job "$SLURM_JOB_ID" | awk -F= '/Command=/{print $2; exit}')")
source "$CELL_DIR/lib/paths.sh"
. "${CELL_DIR}/lib/launch.sh"
srun ft_launcher "${FT_ARGS[@]}" train.py
"""


def production_cell(path: Path, job_name: str, text: str = CELL) -> Path:
    """A chain we did not submit: a batch script that finds its libraries through
    scontrol's Command=, and real NVRx cycle-info files where those libraries say."""
    lib = path.parent / "lib"
    lib.mkdir(parents=True)
    (lib / "paths.sh").write_text('RUNS="$(cd "$CELL_DIR" && pwd)/runs/$SLURM_JOB_NAME"\n')
    (lib / "launch.sh").write_text(
        'FT_ARGS=(--ft-cycle-info-dir "$RUNS/nvrx/$SLURM_JOB_ID/cycle_infos"\n'
        '         --ft-checkpoint-iteration-file "$RUNS/ckpt/iter.txt")\n'
    )
    path.write_text(text)
    target = path.parent / "runs" / job_name / "nvrx" / "4343" / "cycle_infos"
    target.mkdir(parents=True)
    for item in (FIXTURES / "killed").iterdir():
        shutil.copy(item, target / item.name, follow_symlinks=False)
    return path


def test_a_script_that_finds_its_libraries_through_scontrol_keeps_its_cycle_infos(tmp_path):
    cell = production_cell(tmp_path / "cells" / "llm.sbatch", "chain-a")
    platform = SlurmPlatform(run=Scontrol(tmp_path / "submit", cell))
    request = target.Request(job_id="18")
    run, notes = target.locate(request, target.identify(request, platform, "alice", {}))
    cells = tmp_path / "cells"
    assert run.cycle_glob == f"{cells}/runs/chain-a/nvrx/*/cycle_infos/cycle_info.*"
    assert run.tracker == f"{cells}/runs/chain-a/ckpt/iter.txt"
    assert run.origin == f"batch script {cell} + {cells}/lib/paths.sh + {cells}/lib/launch.sh"
    assert notes == []
    assert [c.key for c in CycleReader(run.cycle_glob).scan().cycles] == ["4343.0.0"]


PLAIN = "watch-rec-10163-plain"  # the recorded chain of plain jobs; its job 1 ended 93


class AgingOut:
    """scontrol and sacct as the cluster printed them for job 1 of a chain of plain jobs,
    pointed at a test work dir; after forget(), scontrol has dropped the job (MinJobAge)
    and only sacct knows it, with the SubmitLine it was submitted with."""

    def __init__(self, work: Path, command: Path) -> None:
        def local(name: str) -> str:
            text = (FIXTURES / "slurm" / "singleton" / name).read_text()
            return text.replace("/shared/work/watch-record", str(work))

        self.scontrol = local("scontrol_P.txt").replace(f"{work}/plain.sbatch", str(command))
        self.sacct = local("sacct_describe.txt")
        self.forgotten = False

    def forget(self) -> None:
        self.forgotten = True

    def __call__(self, argv, timeout):
        if argv[0] == "scontrol" and self.forgotten:
            unknown = (FIXTURES / "slurm" / "scontrol_unknown.txt").read_text().strip()
            raise SlurmUnavailable(f"scontrol --oneliner failed: {unknown}")
        if argv[0] == "scontrol":
            return self.scontrol
        if argv[0] == "sacct" and "--jobs" in argv:
            return self.sacct
        return ""  # the pass's squeue and windowed sacct: nothing of the chain left


def watch_once(monkeypatch, slurm: AgingOut, state: Path) -> Run:
    """What one cron run of `nvrx-watch 1` does (main.build, then a pass), with Slurm's
    commands answering from the recordings; returns the run it located."""
    monkeypatch.setattr(watch_shell, "SlurmPlatform", lambda timeout: SlurmPlatform(timeout, slurm))
    settings = Settings(state_file=str(state))
    request = target.Request(job_id="1")
    watcher = build(request, settings, Thresholds(), logging.getLogger("test_watch_cli"))
    watcher.pass_once()
    return watcher.run


def located(cell: Path) -> str:
    return f"{cell.parent}/runs/{PLAIN}/nvrx/*/cycle_infos/cycle_info.*"


def test_a_job_id_aged_out_of_scontrol_keeps_the_script_scontrol_named(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    cell = production_cell(tmp_path / "cells" / "llm.sbatch", PLAIN)
    slurm = AgingOut(work, cell)
    state = tmp_path / "state" / "state.json"
    assert watch_once(monkeypatch, slurm, state).cycle_glob == located(cell)
    slurm.forget()  # MinJobAge later; sacct's SubmitLine names work/plain.sbatch, not there
    assert watch_once(monkeypatch, slurm, state).cycle_glob == located(cell)
    assert persistence.load(str(state))["jobs"]["1"]["command"] == str(cell)


def test_a_job_id_aged_out_of_scontrol_is_read_from_the_script_sacct_names(tmp_path, monkeypatch):
    work = tmp_path / "work"
    cell = production_cell(work / "plain.sbatch", PLAIN)  # submitted from there, by name
    slurm = AgingOut(work, cell)
    slurm.forget()  # the watcher starts after scontrol dropped the job: nothing remembered
    run = watch_once(monkeypatch, slurm, tmp_path / "state" / "state.json")
    assert run.cycle_glob == located(cell)
    assert run.origin.startswith(f"batch script {cell} + ")
    assert [c.key for c in CycleReader(run.cycle_glob).scan().cycles] == ["4343.0.0"]


class LiveGeneration(AgingOut):
    """The same recordings, but job 1 was submitted with --chdir and a relative script
    name, so its SubmitLine names no script; and squeue still lists the chain's job 2
    running, whose scontrol record (job 1's, as job 2 would print it) names the cell."""

    def __init__(self, work: Path, command: Path) -> None:
        super().__init__(work, command)
        self.sacct = self.sacct.replace("--hold ", "--hold --chdir=/elsewhere ")
        self.running = (
            self.scontrol.replace("JobId=1 ", "JobId=2 ")
            .replace("JobState=FAILED Reason=NonZeroExitCode", "JobState=RUNNING Reason=None")
            .replace("ExitCode=93:0", "ExitCode=0:0")
        )
        self.squeue = (FIXTURES / "slurm" / "singleton" / "squeue.txt").read_text()
        self.forget()

    def __call__(self, argv, timeout):
        if argv[0] == "scontrol" and argv[-1] == "2":
            return self.running
        if argv[0] == "squeue":
            return self.squeue
        return super().__call__(argv, timeout)


def test_an_aged_out_id_whose_submit_line_names_no_script_is_read_from_a_live_generation(
    tmp_path, monkeypatch
):
    work = tmp_path / "work"
    cell = production_cell(work / "plain.sbatch", PLAIN)
    slurm = LiveGeneration(work, cell)
    assert "--chdir=/elsewhere" in slurm.sacct and "JobId=2 " in slurm.running
    run = watch_once(monkeypatch, slurm, tmp_path / "state" / "state.json")
    assert run.cycle_glob == located(cell)
    assert run.origin.startswith(f"batch script {cell} + ")
    assert [c.key for c in CycleReader(run.cycle_glob).scan().cycles] == ["4343.0.0"]


@pytest.mark.parametrize(
    "entry",
    [
        {"job_name": "chain-a", "owner": "alice", "work_dir": "/w", "command": "",
         "source": "state", "note": "added by hand"},
        {"job_name": "chain-a", "owner": "alice", "work_dir": 7},
        ["chain-a", "alice"],
    ],
)  # fmt: skip
def test_a_hand_edited_state_entry_costs_its_memory_never_a_pass(entry):
    def unreachable(argv, timeout):
        raise SlurmUnavailable("slurmctld is not answering")

    platform = SlurmPlatform(run=unreachable)
    if "note" in entry:  # an extra key: the identity is still good
        info = target.identify(target.Request(job_id="18"), platform, "bob", {"18": entry})
        assert (info.job_name, info.owner, info.work_dir) == ("chain-a", "alice", "/w")
    else:  # unusable: as if nothing were remembered
        with pytest.raises(SlurmUnavailable):
            target.identify(target.Request(job_id="18"), platform, "bob", {"18": entry})


def test_a_job_id_slurm_has_forgotten_is_followed_from_the_state_file(tmp_path):
    def forgotten(argv, timeout):
        return ""  # scontrol and sacct both answer, and know nothing

    remembered = {
        "18": {
            "job_name": "chain-a",
            "owner": "alice",
            "work_dir": "/w",
            "command": "",
            "source": "state",
        }
    }
    info = target.identify(
        target.Request(job_id="18"), SlurmPlatform(run=forgotten), "bob", remembered
    )
    assert (info.job_name, info.owner) == ("chain-a", "alice")
    with pytest.raises(target.ResolveError, match="unknown to scontrol and sacct; pass --job-name"):
        target.identify(target.Request(job_id="18"), SlurmPlatform(run=forgotten), "bob", {})


def test_the_console_script_and_the_subcommand_are_the_same_command():
    from importlib.metadata import entry_points

    from nvrx_appliance.cli.main import cli

    assert cli.get_command(None, "watch") is watch
    [script] = [e for e in entry_points(group="console_scripts") if e.name == "nvrx-watch"]
    assert script.value == "nvrx_appliance.cli.watch:main"


def test_interval_runs_pass_after_pass_until_sigterm(tmp_path):
    import subprocess
    import sys
    import time

    work = killed_run(tmp_path)
    state = tmp_path / "state" / "state.json"
    watcher = subprocess.Popen(
        [sys.executable, "-c", "from nvrx_appliance.cli.watch import main; main()",
         "--platform", "none", "--work-dir", str(work), "--state-file", str(state), "--interval", "1", "--stall-seconds", "1e9"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    passes: set[float] = set()
    deadline = time.monotonic() + 30
    while len(passes) < 2 and time.monotonic() < deadline and watcher.poll() is None:
        if state.exists():
            section = json.loads(state.read_text())["chains"][f"{_me()}/run"]
            passes.add(section["last_pass"])
        time.sleep(0.05)
    watcher.terminate()
    _, stderr = watcher.communicate(timeout=10)
    assert len(passes) >= 2, stderr
    assert watcher.returncode == 0, stderr
    assert stderr.count("pass over run") >= 2


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


@pytest.mark.parametrize(
    ("variable", "url", "named"),
    [
        ("NVRX_WATCH_WEBHOOK_URL", "https://hooks.example/T0KEN with space", "webhook URL"),
        ("NVRX_WATCH_HEARTBEAT_URL", "hc.example/T0KEN", "heartbeat URL"),
        ("NVRX_WATCH_PAGERDUTY_URL", "ftp://pd.example/T0KEN", "PagerDuty URL"),
        # It passed the start-up check, then every pass crashed with the token in the
        # traceback (http.client.InvalidURL: nonnumeric port: 'T0KEN@hb.example').
        ("NVRX_WATCH_HEARTBEAT_URL", "https://hb:T0KEN@hb.example/ping", "user:token@host"),
        ("NVRX_WATCH_WEBHOOK_URL", "https://T0KEN@hooks.example/x", "user:token@host"),
    ],
)
def test_a_malformed_sink_url_is_one_redacted_line_and_exit_2(tmp_path, variable, url, named):
    result = CliRunner().invoke(
        watch, ["--platform", "none", "--work-dir", str(tmp_path)], env={variable: url}
    )
    assert result.exit_code == 2, result.output
    assert named in result.output and "T0KEN" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_an_empty_routing_key_file_is_refused_and_a_loose_one_warned_about(tmp_path):
    key = tmp_path / "routing-key"
    key.write_text("\n")
    args = ["--platform", "none", "--work-dir", str(tmp_path), "--once"]
    result = invoke(*args, "--pagerduty-routing-key-file", str(key))
    assert result.exit_code == 2
    assert "--pagerduty-routing-key-file" in result.output and "is empty" in result.output

    key.write_text("R0UTING\n")
    key.chmod(0o666)
    result = CliRunner().invoke(watch, [*args, "--pagerduty-routing-key-file", str(key)])
    assert "is open to other users (mode 0666); chmod 600 it" in result.stderr
    assert "R0UTING" not in result.output


def test_a_corrupt_state_entry_or_cycle_cache_row_is_reset_and_logged_not_raised(tmp_path):
    work = killed_run(tmp_path)
    (work / "checkpoints").mkdir()
    (work / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("10\n")
    state = tmp_path / "state" / "state.json"
    args = ("--platform", "none", "--work-dir", str(work), "--state-file", str(state),
            "--stall-seconds", "1e9")  # fmt: skip
    assert invoke(*args).exit_code == 0
    doc = json.loads(state.read_text())
    [key] = doc["chains"]
    doc["chains"][key]["checkpoint"]["first_seen"] = "yesterday"
    doc["chains"][key]["alerts"] = {"webhook": {"some-finding": "never"}}
    state.write_text(json.dumps(doc))
    [cache] = (state.parent / "cycles").glob("*/*.json")
    rows = json.loads(cache.read_text())
    rows["files"] = {name: [1, 2, 3, ["4343", "zero"]] for name in rows["files"]}
    cache.write_text(json.dumps(rows))

    result = CliRunner().invoke(watch, list(args))
    assert result.exit_code == 0, result.output
    assert "checkpoint timer" in result.stderr and "malformed" in result.stderr
    again = json.loads(state.read_text())["chains"][key]
    assert isinstance(again["checkpoint"]["first_seen"], float)
    assert len(json.loads(cache.read_text())["files"]["cycle_info.4343.0.0"][3]) == 8


def test_plain_http_pagerduty_is_refused_unless_asked(tmp_path):
    env = {
        "NVRX_WATCH_PAGERDUTY_ROUTING_KEY": "R0UTING",
        "NVRX_WATCH_PAGERDUTY_URL": "http://pd.example/v2/enqueue",
    }
    args = ["--platform", "none", "--work-dir", str(tmp_path), "--stall-seconds", "1e9"]
    refused = CliRunner().invoke(watch, args, env=env)
    assert refused.exit_code == 2 and "--pagerduty-allow-http" in refused.output
    assert "R0UTING" not in refused.output
    allowed = CliRunner().invoke(watch, [*args, "--pagerduty-allow-http"], env=env)
    assert allowed.exit_code != 2, allowed.output


def test_a_metrics_file_node_exporter_would_not_read_is_refused(tmp_path):
    result = invoke("--platform", "none", "--metrics-file", str(tmp_path / "nvrx.txt"))
    assert result.exit_code == 2
    assert "--metrics-file" in result.output and "*.prom" in result.output
    assert not (tmp_path / "nvrx.txt").exists()


def test_nvrx_watch_says_its_version():
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.output.strip() == f"nvrx-watch, version {__version__}"


# --- the reference watcher's flags ------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "instead"),
    [
        ("--webhook-url", "NVRX_WATCH_WEBHOOK_URL or --webhook-url-file"),
        ("--heartbeat-url", "NVRX_WATCH_HEARTBEAT_URL or --heartbeat-url-file"),
        ("--pd-routing-key", "NVRX_WATCH_PAGERDUTY_ROUTING_KEY or --pagerduty-routing-key-file"),
    ],
)
def test_the_reference_watchers_secret_flags_are_refused_naming_the_replacement(
    tmp_path, flag, instead
):
    secret = "https://hooks.example/T0KEN-secret"
    state = tmp_path / "state.json"
    result = invoke("--platform", "none", "--work-dir", str(tmp_path), "--state-file", str(state),
                    flag, secret)  # fmt: skip
    assert result.exit_code == 2
    assert f"{flag} would show the secret to every user" in result.output
    assert f"set {instead} instead" in result.output
    assert secret not in result.output and not state.exists()  # refused before any pass


def quiet_pass(tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    work = tmp_path / "run" if (tmp_path / "run").exists() else killed_run(tmp_path)
    return invoke("--platform", "none", "--work-dir", str(work), *args, env=env)


def test_a_config_file_sets_flags_by_name_and_flags_and_variables_win(tmp_path):
    config = tmp_path / "watch.toml"
    state = tmp_path / "cfg-state"
    config.write_text(f'stall-seconds = 1\nstate_dir = "{state}"\ndisable = ""\n')
    assert quiet_pass(tmp_path, "--config", str(config)).exit_code == 2  # stalled after 1 s
    assert (state / "state.json").exists()  # --state-dir from the file
    assert quiet_pass(tmp_path, "--config", str(config), "--stall-seconds", "1e9").exit_code == 0
    env = {"NVRX_WATCH_CONFIG": str(config), "NVRX_WATCH_DISABLE": "cycle_stalled"}
    assert quiet_pass(tmp_path, env=env).exit_code == 0


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("grace_period = 3\n", "unknown setting 'grace_period'; keys are nvrx-watch's flag names"),
        ('webhook-url = "https://x/T0KEN"\n', "webhook-url: --webhook-url would show the secret"),
        ("stall-seconds = \n", "is not valid TOML"),
    ],
)
def test_a_config_file_with_a_bad_key_is_one_line_and_exit_2(tmp_path, text, named):
    config = tmp_path / "watch.toml"
    config.write_text(text)
    result = quiet_pass(tmp_path, "--config", str(config), "--state-dir", str(tmp_path / "s"))
    assert result.exit_code == 2 and named in result.output, result.output
    assert "T0KEN" not in result.output and not (tmp_path / "s").exists()


def test_state_dir_holds_the_state_and_excludes_state_file(tmp_path):
    state = tmp_path / "watch-state"
    assert quiet_pass(tmp_path, "--state-dir", str(state), "--stall-seconds", "1e9").exit_code == 0
    assert (state / "state.json").is_file() and (state / "cycles").is_dir()
    both = quiet_pass(tmp_path, "--state-dir", str(state), "--state-file", str(state / "x.json"))
    assert (
        both.exit_code == 2 and "--state-file and --state-dir both place the state" in both.output
    )


def test_checkpoint_iteration_file_is_the_reference_name_of_checkpoint_file(tmp_path):
    tracker = tmp_path / "ckpt" / "latest_checkpointed_iteration.txt"
    tracker.parent.mkdir()
    tracker.write_text("120")
    common = ("--stall-seconds", "1e9", "--state-dir", str(tmp_path / "s"))
    for given in (("--checkpoint-iteration-file", str(tracker)),
                  ("--checkpoint-file", str(tracker))):  # fmt: skip
        result = quiet_pass(tmp_path, *given, *common)
        assert (
            f"checkpoint tracker: {tracker};" in result.output and "checkpoint 120" in result.output
        )
    env = {"NVRX_WATCH_CHECKPOINT_ITERATION_FILE": str(tracker)}  # the reference's variable
    assert "checkpoint 120" in quiet_pass(tmp_path, *common, env=env).output


def test_user_names_the_owner_of_a_chain_watched_by_name(tmp_path):
    result = quiet_pass(tmp_path, "--user", "bob", "--job-name", "llm", "--stall-seconds", "1e9",
                        "--state-dir", str(tmp_path / "s"))  # fmt: skip
    assert result.exit_code == 0 and "pass over llm (bob)" in result.output


def test_verbose_also_logs_each_sources_state(tmp_path):
    common = ("--stall-seconds", "1e9", "--state-dir", str(tmp_path / "s"))
    assert "source cycles: observed" not in quiet_pass(tmp_path, *common).output
    verbose = quiet_pass(tmp_path, "-v", *common).output
    assert "source cycles: observed" in verbose
    assert "source slurm: not configured (--platform none)" in verbose
    assert "detectors skipped for want of a source: orphaned_generation" in verbose


def test_a_run_json_of_gigabytes_is_not_read_whole(tmp_path):
    # The watcher read run.json unbounded: a 2 GiB file (sparse here, so no disk) took a
    # cron pass's memory. Bounded, it is one "ignoring" line and the pass goes on.
    work = tmp_path / "work"
    work.mkdir()
    with (work / "run.json").open("wb") as fh:
        fh.truncate(2 << 30)
    budget = 400 << 20  # address space for the whole watcher, far below the file

    def limit_memory():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (budget, budget))

    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", "from nvrx_appliance.cli.watch import main; main()",
         "--platform", "none", "--work-dir", str(work),
         "--state-file", str(tmp_path / "state" / "state.json")],
        capture_output=True, text=True, timeout=60, preexec_fn=limit_memory,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"ignoring {work}/run.json" in done.stderr and "MemoryError" not in done.stderr


def test_a_second_term_stops_a_pass_that_is_stuck_in_a_call(tmp_path):
    # A pass blocked for hours (a sink that never answers; before, a FIFO) kept its own
    # TERM handler, which swallowed `timeout`'s TERM: the first TERM lets the pass finish,
    # the second must end the process at once.
    import signal
    import socket
    import subprocess
    import sys
    import threading

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    held: list[socket.socket] = []
    accepted = threading.Event()

    def hold() -> None:
        conn, _ = silent.accept()
        held.append(conn)  # read nothing, answer nothing
        accepted.set()

    threading.Thread(target=hold, daemon=True).start()
    work = killed_run(tmp_path)
    env = {
        **os.environ,
        "NVRX_WATCH_HEARTBEAT_URL": f"http://127.0.0.1:{silent.getsockname()[1]}/p",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", "from nvrx_appliance.cli.watch import main; main()",
         "--platform", "none", "--work-dir", str(work), "--stall-seconds", "1e9",
         "--state-file", str(tmp_path / "state" / "state.json")],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    try:
        assert accepted.wait(30), "the pass never reached the heartbeat"
        proc.send_signal(signal.SIGTERM)
        wait_until(
            lambda: any("stopping after this pass" in ln for ln in lines), 10, "the first TERM"
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 128 + signal.SIGTERM  # not after the sink's 10 s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for conn in held:
            conn.close()
        silent.close()
