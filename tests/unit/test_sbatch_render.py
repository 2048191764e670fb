"""The thin sbatch and its sbatch command line, rendered from the run manifest."""

import subprocess

import pytest

from nvrx_appliance import manifest
from nvrx_appliance.chain import ChainSpec
from nvrx_appliance.slurm import render, submit

WORK = "/shared/alice/run"


def _manifest(**over):
    base = dict(work_dir=WORK, train_tasks=2, hot_spares=1, cold_spares=2, gpus_per_node=2)
    return manifest.build(ChainSpec(**{**base, **over}), created="2026-01-01T00:00:00Z", user="a")


def _script(m, extra=()):
    return render.render(
        m, template=submit.template_text(), teardown_py=submit.teardown_source(), extra=extra
    )


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


def test_a_generation_asks_for_the_whole_nodes_memory_as_the_reference_does():
    # Under DefMemPerCPU, a task without --mem gets a per-CPU default, not the node.
    assert "--mem=0" in render.sbatch_args(_manifest())
    assert "--mem=200G" in render.sbatch_args(_manifest(mem="200G"))
    assert not any(a.startswith("--mem") for a in render.sbatch_args(_manifest(mem="")))


def test_a_memory_size_slurm_would_not_take_is_refused():
    from nvrx_appliance.chain import ChainSpec, check

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
    assert "--container-env=NVRX_ARRAY_THROTTLE,NVRX_RUN_MANIFEST" in srun
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


def test_the_script_is_self_contained_and_arms_the_trap_before_anything_can_fail():
    text = _script(_manifest())
    assert "def decide(" in text  # the teardown travels inside the script
    body = text[text.index("if [[ $TASK_ID == 0 ]]") :]
    assert body.splitlines()[3].strip() == "trap task0_teardown EXIT"
    assert "{{" not in text
    assert "#SBATCH --array=0-4%3" in text


def test_a_spare_checks_the_closed_flag_before_starting_a_container():
    text = _script(_manifest(image="/img/a.sqsh", runtime="pyxis"))
    assert text.index("elif [[ -e $CLOSED ]]") < text.index("--container-image")
    assert "exit 71" in text  # TASK0_GONE, never 93
