"""What submit refuses, and how it says so: one line naming the option and the fix."""

import dataclasses
import json
import os
import sys

import pytest
from click.testing import CliRunner

from nvrx_appliance import ENTRYPOINT_PROTOCOL
from nvrx_appliance.chain import probe
from nvrx_appliance.cli.main import cli
from nvrx_appliance.settings.chain import ChainSpec
from nvrx_appliance.settings.validate import Facts, is_image_file, is_registry_ref, judge

SHARED = "/shared/alice/run"
GOOD_FACTS = Facts(work_dir_real=SHARED, max_array_size=1001)


def _spec(**over):
    base = dict(
        work_dir=SHARED,
        workload="cpu",
        runtime="bare",
        python=sys.executable,
        train_tasks=2,
        hot_spares=1,
        gpus_per_node=2,
    )
    return ChainSpec(**{**base, **over})


def _messages(spec, facts=GOOD_FACTS, force=False):
    return [str(p) for p in judge(spec, facts, force=force)]


def test_a_sane_spec_on_a_sane_cluster_passes():
    assert _messages(_spec()) == []


@pytest.mark.parametrize(
    ("over", "facts", "expected"),
    [
        ({"train_tasks": 0}, {}, "--train-tasks: must be at least 1 (got 0)"),
        ({"hot_spares": -1}, {}, "--hot-spares: cannot be negative (got -1); use 0 for none"),
        ({"cold_spares": -2}, {}, "--cold-spares: cannot be negative (got -2)"),
        (
            {"cold_spares": 10},
            {"max_array_size": 8},
            "--cold-spares: a pool of 13 tasks exceeds the cluster's MaxArraySize=8; "
            "lower --cold-spares to at most 5",
        ),
        (
            {},
            {"work_dir_real": "/tmp/run"},
            "--work-dir: /shared/alice/run is node-local (/tmp/run)",
        ),
        ({}, {"work_dir_real": "/dev/shm/x"}, "use a shared file system"),
        (
            {},
            {"work_dir_error": "/shared/alice/run is not writable"},
            "--work-dir: /shared/alice/run is not writable; pick a directory you can write",
        ),
        (
            {"image": "/img/missing.sqsh", "runtime": "pyxis"},
            {"image_error": "/img/missing.sqsh does not exist; build it with `make image`"},
            "--image: /img/missing.sqsh does not exist",
        ),
        (
            {"image": "registry.example#Bad Image!!", "runtime": "pyxis"},
            {},
            "--image: 'registry.example#Bad Image!!' is neither an image file nor a registry reference",
        ),
        (
            {"image": "registry.example#nvidia/pytorch:25.01-py3", "runtime": "bwrap-standin"},
            {},
            "--image: the bwrap stand-in runs a local .sqsh file",
        ),
        (
            {"workload": "megatron", "megatron_path": "/nowhere"},
            {"megatron_has_pretrain": False},
            "--megatron-path: /nowhere has no pretrain_gpt.py",
        ),
        (
            {"global_batch": 3},
            {},
            "--global-batch: 3 is not divisible by micro batch x data-parallel size = 1 x 4",
        ),
        (
            {"workload": "megatron", "tensor_parallel": 3},
            {},
            "--train-tasks: a world of 4 ranks is not divisible by TP 3 x PP 1 x CP 1 = 3",
        ),
        (
            {"tensor_parallel": 2},
            {},
            "--tensor-parallel: applies to --workload megatron; a cpu workload is "
            "data-parallel over every rank",
        ),
        (
            {},
            {"name_in_use": ("101", "102")},
            "--job-name: 'nvrx-chain' is used by your queued or running job(s) 101, 102",
        ),
        ({}, {"slurm_error": "scontrol timed out"}, "slurm: unreachable (scontrol timed out)"),
        ({}, {"python_error": "/x/bin has no nvrx-entrypoint"}, "--python: /x/bin has no"),
    ],
)
def test_each_refusal_names_the_option_and_the_fix(over, facts, expected):
    messages = _messages(_spec(**over), dataclasses.replace(GOOD_FACTS, **facts))
    assert len(messages) == 1, messages
    assert messages[0].startswith(expected) or expected in messages[0]


def test_force_submits_under_a_name_in_use_but_not_past_an_unreachable_slurm():
    facts = dataclasses.replace(GOOD_FACTS, name_in_use=("101",))
    assert _messages(_spec(), facts, force=True) == []
    down = dataclasses.replace(GOOD_FACTS, slurm_error="down")
    assert _messages(_spec(), down, force=True) != []


def test_a_work_dir_holding_another_live_chains_manifest_is_refused():
    facts = dataclasses.replace(GOOD_FACTS, work_dir_chain="other", work_dir_chain_live=("7",))
    [message] = _messages(_spec(), facts)
    assert message.startswith("--work-dir:") and "nvrx-appliance cancel other" in message


def test_a_work_dir_whose_chain_completed_takes_only_a_longer_run_or_force():
    done = dataclasses.replace(
        GOOD_FACTS, work_dir_completed=200, work_dir_spec=_spec(train_samples=800)
    )
    [refused] = _messages(_spec(train_samples=800), done)
    assert refused.startswith("--work-dir: the chain trained in /shared/alice/run completed at")
    assert "Raise --train-samples to train further, or pass --force" in refused
    assert _messages(_spec(train_samples=1600), done) == []  # trains further
    assert _messages(_spec(train_samples=800), done, force=True) == []


def test_probe_reads_the_training_done_marker_and_the_chain_that_left_it(tmp_path):
    from nvrx_appliance import manifest

    work = tmp_path / "run"
    old = _spec(work_dir=str(work), train_samples=800)
    manifest.save(manifest.build(old, created="c", user="alice"))
    (work / "checkpoints").mkdir()
    assert probe.gather(old, with_slurm=False, user="alice").work_dir_completed is None
    (work / "checkpoints" / "training_done.txt").write_text("200\n")
    facts = probe.gather(old, with_slurm=False, user="alice")
    assert (facts.work_dir_completed, facts.work_dir_spec) == (200, old)


def test_an_image_of_another_entrypoint_protocol_or_flavour_is_refused():
    old = {"entrypoint_protocol": ENTRYPOINT_PROTOCOL + 1, "flavor": "gpu"}
    spec = _spec(image="/img/a.sqsh", runtime="pyxis")
    [message] = _messages(spec, dataclasses.replace(GOOD_FACTS, image_manifest=old))
    assert message.startswith("--image:") and "rebuild it with `make image`" in message
    cpu = {"entrypoint_protocol": ENTRYPOINT_PROTOCOL, "flavor": "cpu", "probed": {}}
    spec = _spec(image="/img/a.sqsh", runtime="pyxis", workload="megatron")
    [message] = _messages(spec, dataclasses.replace(GOOD_FACTS, image_manifest=cpu))
    assert message.startswith("--workload:")


def test_an_image_without_the_trainer_run_json_names_is_refused_before_anything_is_queued():
    """An image built before the trainer moved speaks protocol 3 and holds the trainer
    under its old name: every rank of a --workload cpu chain would fail on a missing
    module until NVRx ended the chain with 93."""
    spec = _spec(image="/img/a.sqsh", runtime="pyxis", workload="cpu")
    before_move = {
        "entrypoint_protocol": ENTRYPOINT_PROTOCOL,
        "flavor": "cpu",
        "appliance_version": "0.1.0",
        "probed": {"trainer_module": "nvrx_appliance.cpu_trainer"},
    }
    [message] = _messages(spec, dataclasses.replace(GOOD_FACTS, image_manifest=before_move))
    assert message == (
        "--image: --workload cpu runs nvrx_appliance.workloads.cpu, which the image does not "
        "hold (it holds nvrx_appliance.cpu_trainer; built by nvrx-appliance 0.1.0); rebuild "
        "it with `make image`"
    )
    protocol_3 = {**before_move, "entrypoint_protocol": 3}
    [message] = _messages(spec, dataclasses.replace(GOOD_FACTS, image_manifest=protocol_3))
    assert "protocol 3" in message and f"speaks {ENTRYPOINT_PROTOCOL}" in message
    held = {**before_move, "probed": {"trainer_module": "nvrx_appliance.workloads.cpu"}}
    assert _messages(spec, dataclasses.replace(GOOD_FACTS, image_manifest=held)) == []


def test_a_megatron_path_the_image_does_not_hold_is_refused_unless_a_mount_brings_it():
    image = {"entrypoint_protocol": ENTRYPOINT_PROTOCOL, "flavor": "gpu", "probed": {},
             "pins": {"megatron_path": "/workspace/megatron-lm"}}  # fmt: skip
    facts = dataclasses.replace(GOOD_FACTS, image_manifest=image)
    spec = _spec(image="/img/a.sqsh", runtime="pyxis", workload="megatron",
                 megatron_path="/opt/megatron")  # fmt: skip
    assert _messages(spec, facts) == [
        "--megatron-path: /opt/megatron is not where the image holds Megatron-LM "
        "(/workspace/megatron-lm) nor under a container mount; pass --megatron-path "
        "/workspace/megatron-lm, or mount your own checkout there with --mounts"
    ]
    assert (
        _messages(dataclasses.replace(spec, megatron_path="/workspace/megatron-lm/"), facts) == []
    )
    mounted = dataclasses.replace(spec, mounts=f"{SHARED}:{SHARED},/home/alice/mlm:/opt/megatron")
    assert _messages(mounted, facts) == []


def test_an_image_given_with_bare_metal_is_refused_not_ignored():
    result = CliRunner().invoke(
        cli, ["submit", "--dry-run", "--runtime", "bare", "--workload", "cpu", "--work-dir",
              SHARED, "--image", "/images/a.sqsh"], env={"SLURM_CONF": "/nonexistent"},
    )  # fmt: skip
    assert result.exit_code == 2 and "#!/bin/bash" not in result.stdout
    assert "--image: /images/a.sqsh would not be used: --runtime bare" in result.stderr


def test_the_protocol_moved_past_the_images_built_before_the_trainer_moved():
    assert ENTRYPOINT_PROTOCOL >= 4


def test_every_problem_is_reported_at_once():
    facts = dataclasses.replace(GOOD_FACTS, work_dir_real="/tmp/x", name_in_use=("5",))
    messages = _messages(_spec(train_tasks=0), facts)
    assert [m.split(":")[0] for m in messages] == ["--train-tasks", "--work-dir", "--job-name"]


@pytest.mark.parametrize(
    "image",
    [
        "registry.example#nvidia/pytorch:25.01-py3",
        "docker://ubuntu:24.04",
        "alice@registry:5000#team/img:v1",
    ],
)
def test_registry_references_are_recognised(image):
    assert not is_image_file(image) and is_registry_ref(image)


def test_probe_sees_a_node_local_work_dir_and_a_missing_image(tmp_path):
    spec = _spec(work_dir=str(tmp_path / "run"), image=str(tmp_path / "a.sqsh"), runtime="pyxis")
    facts = probe.gather(spec, with_slurm=False, user="alice")
    assert facts.work_dir_real.startswith("/tmp/")
    assert facts.image_error.endswith("does not exist; build it with `make image` or fix the path")


def test_probe_says_a_work_dir_below_a_file_cannot_be_created(tmp_path):
    (tmp_path / "file").write_text("")
    facts = probe.gather(_spec(work_dir=str(tmp_path / "file" / "run")), with_slurm=False, user="a")
    assert "cannot be created" in facts.work_dir_error


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--work-dir", "{long}/run", "File name too long"),
        ("--image", "{long}.sqsh", "File name too long"),
        ("--python", "{long}/bin/python", "File name too long"),
        ("--megatron-path", "{long}", "has no pretrain_gpt.py"),
    ],
)
def test_a_path_component_longer_than_the_file_system_allows_is_one_line(
    tmp_path, option, value, said
):
    # 300 characters: more than NAME_MAX (255), so looking the path up raises ENAMETOOLONG,
    # which submit's probe let out as a traceback.
    path = value.format(long=str(tmp_path / ("a" * 300)))
    runtime = "pyxis" if option == "--image" else "bare"  # bare metal runs no image
    args = ["submit", "--runtime", runtime, "--work-dir", "/shared/alice/x", option, path]
    result = CliRunner().invoke(cli, [*args, "--dry-run"], env={"SLURM_CONF": "/nonexistent"})
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    mine = [line for line in result.stderr.splitlines() if f"submit: {option}: " in line]
    assert len(mine) == 1 and said in mine[0], result.stderr


def test_probe_refuses_a_bare_python_without_the_entrypoint_beside_it(tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    facts = probe.gather(_spec(python=str(python)), with_slurm=False, user="a")
    assert facts.python_error.endswith("(the same path on every node)")


def test_a_refused_submission_writes_nothing_and_exits_2(tmp_path):
    work = tmp_path / "run"
    # No reachable Slurm: SLURM_CONF names a file that does not exist.
    env = {"SLURM_CONF": str(tmp_path / "none.conf"), "NVRX_WORK_DIR": str(work)}
    result = CliRunner().invoke(cli, ["submit", "--workload", "cpu", "--train-tasks", "0"], env=env)
    assert result.exit_code == 2
    lines = result.stderr.splitlines() if hasattr(result, "stderr") else result.output.splitlines()
    assert any(line.startswith("nvrx-appliance submit: --train-tasks:") for line in lines)
    assert any("slurm: unreachable" in line for line in lines)
    assert any("--work-dir:" in line and "node-local" in line for line in lines)
    assert not work.exists()


def test_a_dry_run_works_without_slurm_and_writes_nothing(tmp_path):
    work = tmp_path / "run"
    env = {"SLURM_CONF": str(tmp_path / "none.conf")}
    args = ["submit", "--workload", "cpu", "--work-dir", "/shared/x", "--dry-run", "--json"]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert len(doc["commands"]) == 3 and doc["commands"][0][0] == "sbatch"
    assert "skipped MaxArraySize and job-name checks" in doc["warnings"][0]
    assert not work.exists() and not os.path.exists("/shared/x")


def test_a_file_that_is_not_an_image_is_refused_with_the_image_readers_words(tmp_path):
    junk = tmp_path / "model.sqsh"
    junk.write_bytes(b"not a squashfs image at all")
    spec = _spec(image=str(junk), runtime="pyxis")
    facts = dataclasses.replace(GOOD_FACTS, **_image_facts(spec))
    [message] = _messages(spec, facts)
    assert message.startswith(f"--image: {junk}")


def _image_facts(spec):
    gathered = probe.gather(spec, with_slurm=False, user="a")
    return {"image_error": gathered.image_error, "image_manifest": gathered.image_manifest}


def _dry_run(args, env=None, tmp_path=None):
    base = {"SLURM_CONF": "/nonexistent/slurm.conf", "NVRX_WORK_DIR": "/shared/alice/run"}
    argv = ["submit", "--dry-run", "--runtime", "bare", "--workload", "cpu", *args]
    return CliRunner().invoke(cli, argv, env={**base, **(env or {})})


def _refused_in_one_line(result, option):
    assert result.exit_code == 2, result.output
    assert "#!/bin/bash" not in result.stdout  # no script was rendered
    lines = [line for line in result.stderr.splitlines() if option in line]
    assert len(lines) == 1, result.stderr


@pytest.mark.parametrize(
    ("args", "env", "option"),
    [
        (["--work-dir", "/srv/x\nid>/tmp/INJECTED;:"], {}, "--work-dir"),
        (["--partition", "gpu\nid"], {}, "--partition"),
        ([], {"NVRX_WORK_DIR": "/srv/x\rid"}, "--work-dir"),
        (["--mounts", "/a:/a\n/b:/b"], {}, "--mounts"),
        (["--job-name", "abc\n"], {}, "--job-name"),  # `$` would let the newline through
        (["--time", "01:00:00\n"], {}, "--time"),
        (["--", "--comment=x\nid"], {}, "after `--`"),
    ],
)
def test_a_control_character_in_any_value_is_refused_before_anything_is_rendered(args, env, option):
    _refused_in_one_line(_dry_run(args, env), option)


def test_a_control_character_in_the_config_file_is_refused(tmp_path):
    config = tmp_path / "chain.toml"
    config.write_text('partition = "gpu\\nid"\n')
    _refused_in_one_line(_dry_run(["--config", str(config)]), "--partition")


def test_a_config_file_that_is_not_utf8_is_refused_in_one_line(tmp_path):
    config = tmp_path / "chain.toml"
    config.write_bytes(b"job_name = '\xff'\n")
    result = _dry_run(["--config", str(config)])
    assert result.exit_code == 2, result.exception
    assert f"--config {config}" in result.stderr and "UTF-8" in result.stderr


@pytest.mark.parametrize(
    ("args", "env", "option"),
    [
        (["--segment", "²"], {}, "--segment"),
        # Fault ranks matter only where faults are injected: the demo modes.
        (["--mode", "handoff", "--fault-ranks", "²"], {}, "--fault-ranks"),
        (["--mode", "handoff"], {"NVRX_FAULT_RANKS": "1,²"}, "--fault-ranks"),
        (
            [
                "--mode",
                "handoff",
                "--fault-ranks",
                "0,4",
                "--train-tasks",
                "2",
                "--gpus-per-node",
                "2",
            ],
            {},
            "outside",
        ),
        (["--job-name", "train,eval"], {}, "--job-name"),  # a list to squeue/sacct --name
    ],
)
def test_digits_that_are_not_ascii_and_ranks_outside_the_world_are_refused(args, env, option):
    _refused_in_one_line(_dry_run(args, env), option)


@pytest.mark.parametrize(
    "extra",
    [
        ["--qos=high", "notanoption"],
        ["--requeue"],
        ["--dependency=afterany:1"],
        ["--array=0-63"],
        ["--arr=0-63"],  # getopt_long takes an unambiguous prefix
        ["-a0-63"],
        ["-vJother"],
        ["--job-name=other"],
        ["--qos", "high"],  # "high" would be the batch script
    ],
)
def test_extra_arguments_that_would_change_the_chain_or_the_script_are_refused(extra):
    _refused_in_one_line(_dry_run(["--", *extra]), "after `--`")


def test_extra_options_with_their_values_attached_pass():
    result = _dry_run(["--", "--qos=high", "-pgpu", "--begin=now+3600", "-vv"])
    assert result.exit_code == 0, result.output
    assert "#SBATCH --qos=high" in result.stdout and "#SBATCH -pgpu" in result.stdout


def test_probe_refuses_a_work_dir_others_can_write(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    facts = probe.gather(_spec(work_dir=str(shared)), with_slurm=False, user="alice")
    assert "writable by group or others (mode 0775)" in facts.work_dir_error


@pytest.mark.parametrize(
    ("args", "option", "words"),
    [
        (["--mounts", "garbage,,::x:y:z:w"], "--mounts", "needs absolute paths"),
        (["--mounts", "/a:/a,,::x:y:z:w"], "--mounts", "is not SRC[:DST[:ro|rw]]"),
        (["--mounts", "/data:/data"], "--mounts", "add /shared/alice/run:/shared/alice/run"),
        (["--work-dir", "/shared/a,b"], "--work-dir", "container mounts cannot express"),
        (["--work-dir", "/shared/a:b"], "--work-dir", "container mounts cannot express"),
        (["--runtime", "bare", "--work-dir", "/shared/run-%j"], "--work-dir", "expands"),
    ],
)
def test_mounts_pyxis_or_apptainer_would_mis_split_are_refused(args, option, words):
    container = ["--runtime", "pyxis", "--image", "registry.example#nvidia/pytorch:25.01-py3"]
    result = _dry_run([*container, *args])
    _refused_in_one_line(result, option)
    assert words in result.stderr


def test_mounts_that_cover_the_work_dir_at_its_own_path_pass():
    container = ["--runtime", "pyxis", "--image", "registry.example#nvidia/pytorch:25.01-py3"]
    result = _dry_run([*container, "--mounts", "/data:/mnt/data:ro,/shared:/shared"])
    assert result.exit_code == 0, result.output
