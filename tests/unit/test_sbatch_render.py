"""The thin sbatch and its sbatch command line, rendered from the run manifest."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from nvrx_appliance import manifest
from nvrx_appliance.chain import render, submit
from nvrx_appliance.settings.chain import ChainSpec

WORK = "/shared/alice/run"


def _manifest(**over):
    base = dict(work_dir=WORK, train_tasks=2, hot_spares=1, cold_spares=2, gpus_per_node=2)
    return manifest.build(ChainSpec(**{**base, **over}), created="2026-01-01T00:00:00Z", user="a")


def _script(m, extra=()):
    return render.render(m, template=submit.template_text(), extra=extra)


def _srun(m):
    return [a.text if isinstance(a, render.Var) else a for a in render.launch_argv(m)]


def test_sbatch_args_carry_the_chain_shape_once():
    args = render.sbatch_args(_manifest(time_limit="00:20:00", partition="gpu"), ("--qos=hi",))
    assert args[:5] == [
        "--job-name=nvrx-chain",
        "--array=0-4%3",
        "--dependency=singleton",
        "--no-requeue",
        "--exclusive",
    ]
    assert {"--nodes=1", "--time=00:20:00", "--gpus-per-node=2", "--partition=gpu"} <= set(args)
    assert args[-1] == "--qos=hi"  # extra args come last, so they win


# The #SBATCH lines of NVRx's reference nvrx_singleton_array.sbatch, by option, with the
# value each must have here: the chain's shape, or the setting that replaces the
# reference's demo default (its --time=00:25:00 and --job-name=nvrx_singleton).
REFERENCE_DIRECTIVES = {
    "--job-name": "=nvrx-chain",
    "--nodes": "=1",
    "--ntasks-per-node": "=1",
    "--exclusive": "",
    "--mem": "=0",
    "--array": "=0-4%3",
    "--dependency": "=singleton",
    "--no-requeue": "",
    "--time": "=01:00:00",
}


def test_every_directive_of_the_reference_sbatch_is_in_the_command_and_the_script():
    m = _manifest()
    args = render.sbatch_args(m)
    lines = [line.removeprefix("#SBATCH ") for line in _script(m).splitlines()]
    for option, value in REFERENCE_DIRECTIVES.items():
        assert option + value in args, option
        assert option + value in lines, option
    # Each is a setting or part of the shape, never a constant a user must edit the script for.
    assert "--time=03:00:00" in render.sbatch_args(_manifest(time_limit="03:00:00"))
    assert "--nodes=2" in render.sbatch_args(_manifest(nodes_per_task=2))


def test_a_generation_asks_for_the_whole_nodes_memory_as_the_reference_does():
    # Under DefMemPerCPU, a task without --mem gets a per-CPU default, not the node.
    assert "--mem=0" in render.sbatch_args(_manifest())
    assert "--mem=200G" in render.sbatch_args(_manifest(mem="200G"))
    assert not any(a.startswith("--mem") for a in render.sbatch_args(_manifest(mem="")))


def test_a_memory_size_slurm_would_not_take_is_refused():
    from nvrx_appliance.settings.chain import ChainSpec, check

    problems = check(ChainSpec(work_dir="/shared/x", mem="lots"))
    assert any(p.option == "--mem" and "not a Slurm memory size" in p.message for p in problems)


def test_the_cpu_workload_asks_slurm_for_no_gpus():
    m = _manifest(workload="cpu")
    assert not any(a.startswith("--gpus") for a in render.sbatch_args(m) + _srun(m))


def test_pyxis_runs_the_entrypoint_in_the_image_with_the_work_dir_mounted_by_default():
    srun = _srun(_manifest(image="/img/a.sqsh", runtime="pyxis"))
    assert "--container-image=/img/a.sqsh" in srun
    assert "--container-mounts=/shared/alice/run:/shared/alice/run" in srun
    assert "--no-container-mount-home" in srun
    assert "--container-name=nvrx_${ARRAY_JOB_ID}_${TASK_ID}" in srun
    assert (
        "--container-env=NVRX_ARRAY_THROTTLE,NVRX_ARRAY_SUBMITTED,NVRX_RUN_MANIFEST,NVRX_TERM_DRAIN"
        in srun
    )
    assert srun[-3:] == ["nvrx-entrypoint", "--manifest", f"{WORK}/run.json"]


def test_explicitly_empty_mounts_mount_nothing():
    srun = _srun(_manifest(image="/img/a.sqsh", runtime="pyxis", mounts=""))
    assert not any(a.startswith("--container-mounts") for a in srun)
    app = _srun(_manifest(image="/img/a.sif", runtime="apptainer", mounts=""))
    assert "--bind" not in app


def test_apptainer_execs_the_image_with_gpus_and_binds():
    srun = _srun(_manifest(image="/img/a.sif", runtime="apptainer", mounts="/data:/data"))
    i = srun.index("apptainer")
    assert srun[i : i + 4] == ["apptainer", "exec", "--nv", "--no-home"]
    assert srun[i + 4 : i + 7] == ["--bind", "/data:/data", "/img/a.sif"]


def test_bare_mode_runs_the_entrypoint_of_the_venv_that_submitted():
    m = _manifest(runtime="bare", python="/opt/venv/bin/python")
    assert _srun(m)[-3:] == ["/opt/venv/bin/nvrx-entrypoint", "--manifest", f"{WORK}/run.json"]
    assert "export PATH=/opt/venv/bin:$PATH" in _script(m)


def test_the_bwrap_stand_in_wraps_the_entrypoint_like_pyxis_would():
    m = _manifest(image="/img/a.sqsh", runtime="bwrap-standin", python="/opt/venv/bin/python")
    srun = _srun(m)
    i = srun.index("/opt/venv/bin/python")
    assert srun[i:] == [
        "/opt/venv/bin/python", "-m", "nvrx_appliance.image.standin", "run",
        "--image", "/img/a.sqsh", "--mounts", f"{WORK}:{WORK}",
        "--", "nvrx-entrypoint", "--manifest", f"{WORK}/run.json",
    ]  # fmt: skip


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer", "bare", "bwrap-standin"])
def test_every_rendered_script_is_valid_bash(runtime, tmp_path):
    m = _manifest(runtime=runtime, image="/img/a.sqsh", python="/opt/venv/bin/python")
    path = tmp_path / "g.sbatch"
    path.write_text(_script(m))
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0


def test_the_script_is_thin_names_its_teardown_file_and_arms_the_trap_before_anything_can_fail():
    text = _script(_manifest())
    assert "def decide(" not in text  # the teardown is a file beside run.json, not inlined
    assert f"TEARDOWN={WORK}/teardown.py" in text
    body = text[text.index("if [[ $TASK_ID == 0 ]]") :]
    assert body.splitlines()[1].split("#")[0].strip() == "trap task0_teardown EXIT"
    assert "{{" not in text
    assert "#SBATCH --array=0-4%3" in text


def test_a_spare_checks_the_closed_flag_before_starting_a_container():
    text = _script(_manifest(image="/img/a.sqsh", runtime="pyxis"))
    check = text.index('grep -qsxF "generation=$GENERATION" "$CLOSED"')
    assert check < text.index("--container-image")
    assert "exit 71" in text  # TASK0_GONE, never 93


# Legal in a path, a partition or an image name, and each one of them a way into a shell
# that splices instead of quoting. (Control characters never get this far: see
# test_submit_validation.)
HOSTILE = 'it\'s "a" $(touch PWNED) `touch PWNED`; touch PWNED & | > #x \\ {a,b} *'


def _stand_in(bindir, name, code=0):
    """A stand-in for a Slurm client: records its argv (NUL-separated), prints nothing."""
    path = bindir / name
    path.write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" >> "$STANDIN_LOG/{name}"\nexit {code}\n')
    path.chmod(0o755)


def _recorded(log, name):
    calls = (log / name).read_bytes().decode() if (log / name).exists() else ""
    return calls.split("\0")[:-1]


@pytest.mark.parametrize("task_id", ["0", "1"])
def test_hostile_values_reach_srun_and_the_teardown_whole_and_run_nothing(tmp_path, task_id):
    work = tmp_path / f"work {HOSTILE}"
    venv_bin = tmp_path / f"venv {HOSTILE}" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)
    m = _manifest(
        work_dir=str(work), runtime="bare", python=str(venv_bin / "python"), workload="cpu",
        partition=f"gpu {HOSTILE}",
    )  # fmt: skip
    manifest.save(m)
    submit.write_teardown(m.layout)
    script = tmp_path / "g.sbatch"
    script.write_text(_script(m, extra=(f"--comment={HOSTILE}",)))
    stand_ins, log, cwd = tmp_path / "slurm-stand-ins", tmp_path / "log", tmp_path / "cwd"
    for folder in (stand_ins, log, cwd):
        folder.mkdir()
    for name in ("srun", "scontrol", "scancel"):
        _stand_in(stand_ins, name)
    env = {
        "PATH": f"{stand_ins}:/usr/bin:/bin",
        "HOME": str(cwd),
        "STANDIN_LOG": str(log),
        "SLURM_ARRAY_JOB_ID": "77",
        "SLURM_ARRAY_TASK_ID": task_id,
        "SLURM_JOB_ID": f"7{8 + int(task_id)}",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_JOB_NAME": "nvrx-chain",
        "SLURM_JOB_USER": "alice",
    }

    done = subprocess.run(["bash", str(script)], cwd=cwd, env=env, capture_output=True, text=True)

    assert done.returncode == 0, done.stderr
    assert not [p for p in tmp_path.rglob("PWNED")], "an injected command ran"
    expected = [a if isinstance(a, str) else "--ntasks=1" for a in render.launch_argv(m)][1:]
    assert _recorded(log, "srun") == expected
    # Issue 24: a peer asks for its own record only; task 0 for the array's, once, and
    # for Slurm's KillWait (its TERM drain).
    config = ["show", "config"] if task_id == "0" else []
    assert _recorded(log, "scontrol") == [*config, "show", "job", "77" if task_id == "0" else "79"]
    if task_id == "0":
        assert (m.layout.control("77") / "closed").is_file()
        assert _recorded(log, "scancel") == ["--state=PENDING", "--user=alice", "77"]
        assert json.loads(m.layout.ledger.read_text())["action"] == "released_spares"


@pytest.mark.parametrize("witness", ["closed", "no_restart"])
def test_a_spare_admitted_after_the_generation_ended_leaves_without_srun(tmp_path, witness):
    # task 0's closed flag, or a peer's exit-93 witness (written before task 0's launcher
    # has drained): a cold spare admitted now must not start anything.
    from nvrx_appliance.node import control, controldir

    m = _manifest(work_dir=str(tmp_path / "work"), runtime="bare", workload="cpu")
    manifest.save(m)
    script = tmp_path / "g.sbatch"
    script.write_text(_script(m))
    stand_ins, log = tmp_path / "slurm-stand-ins", tmp_path / "log"
    for folder in (stand_ins, log):
        folder.mkdir()
    for name in ("srun", "scontrol", "scancel"):
        _stand_in(stand_ins, name)
    directory = m.layout.control("77")
    controldir.prepare(directory, os.geteuid())
    ours = control.generation(m.chain_id, "77")  # the scontrol stand-in gives no SubmitTime
    if witness == "closed":
        controldir.close(directory, {"exit_code": 0, "generation": ours})
    else:
        controldir.mark_no_restart(directory, 93, ours)
    env = {
        "PATH": f"{stand_ins}:/usr/bin:/bin",
        "STANDIN_LOG": str(log),
        "SLURM_ARRAY_JOB_ID": "77",
        "SLURM_ARRAY_TASK_ID": "2",
        "SLURM_JOB_NUM_NODES": "1",
    }
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 71, done.stderr  # TASK0_GONE, never 93
    assert _recorded(log, "srun") == []
    # Logged as every log line of the appliance is: the UTC time to the millisecond.
    assert re.search(
        r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z nvrx: generation 77 is over .*task 2 leaves$",
        done.stderr,
        flags=re.MULTILINE,
    ), done.stderr


def test_every_log_line_of_the_batch_script_carries_the_utc_time():
    # Only `say` writes a log line; `echo` only hands a reason to its caller.
    text = submit.template_text()
    logged = re.findall(r"^.*\becho\b.*$", text, flags=re.MULTILINE)
    assert logged and all('echo "$path ' in line for line in logged), logged
    assert "printf '%s %s\\n' \"$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)\"" in text


@pytest.mark.skipif(
    shutil.which("sbatch") is None, reason="needs Slurm's sbatch (Debian slurm-client)"
)
def test_sbatch_reads_every_directive_back_as_the_argument_it_was(tmp_path):
    m = _manifest(work_dir=f"/srv/{HOSTILE}", partition="gpu", workload="cpu")
    extra = (f"--comment={HOSTILE}", "--qos=high")
    script = tmp_path / "g.sbatch"
    script.write_text(_script(m, extra=extra))
    # No controller: sbatch parses the script, says what it found, then fails to connect.
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=probe\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=1\n"
        "MessageTimeout=1\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1 Default=YES\n"
    )
    done = subprocess.run(
        ["sbatch", "-vvvv", str(script)], env={**os.environ, "SLURM_CONF": str(conf)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    found = re.findall(r'Found in script, argument "(.*)"\n', done.stderr)
    assert found == render.sbatch_args(m, extra)
