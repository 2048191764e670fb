"""The bwrap stand-in's planning (the runs themselves are integration tests)."""

from __future__ import annotations

import re

import pytest

from nvrx_appliance import exitcodes
from nvrx_appliance.image import standin
from nvrx_appliance.image.standin import StandinError


def test_mounts_use_pyxis_syntax():
    assert standin.parse_mounts("/work:/work,/data:/mnt/data:ro,/scratch") == [
        ("/work", "/work", False),
        ("/data", "/mnt/data", True),
        ("/scratch", "/scratch", False),
    ]
    assert standin.parse_mounts("") == []


@pytest.mark.parametrize("bad", ["work:/work", "/a:/b:rx", "/a:/b:ro:x", ":/b"])
def test_bad_mounts_are_usage_errors_naming_the_option(bad):
    with pytest.raises(StandinError, match="--mounts") as caught:
        standin.parse_mounts(bad)
    assert caught.value.code == exitcodes.USAGE


def test_a_rebuilt_image_gets_a_new_unpacked_copy():
    first = standin.cache_key("/images/a.sqsh", 100, 1_000, 7)
    assert standin.cache_key("/images/a.sqsh", 100, 1_000, 7) == first
    assert standin.cache_key("/images/a.sqsh", 100, 2_000, 7) != first
    assert standin.cache_key("/images/a.sqsh", 100, 1_000, 8) != first


def test_the_working_directory_follows_the_mount_that_carries_it():
    mounts = [("/shared/work", "/work", False)]
    assert standin.inside_cwd("/shared/work/run1", mounts) == "/work/run1"
    assert standin.inside_cwd("/shared/work", mounts) == "/work"
    assert standin.inside_cwd("/shared/workspace", mounts) == "/"


def test_bwrap_keeps_the_nodes_network_and_hostname_and_binds_the_mounts():
    argv = standin.bwrap_argv(
        "/cache/img",
        [("/w", "/w", False), ("/d", "/d", True)],
        cwd="/w",
        home="/root",
        host_files=["/etc/hosts"],
        info_fd=5,
        command=["nvrx-entrypoint", "--version"],
    )
    assert argv[:4] == ["bwrap", "--ro-bind", "/cache/img", "/"]
    assert not any(a.startswith("--unshare") for a in argv)
    joined = " ".join(argv)
    assert "--bind /w /w" in joined and "--ro-bind /d /d" in joined
    assert "--ro-bind /etc/hosts /etc/hosts" in joined
    assert argv[-3:] == ["--", "nvrx-entrypoint", "--version"]


def test_the_image_path_replaces_the_hosts_and_host_python_settings_are_dropped():
    env = standin.container_env(
        {"PATH": "/host/venv/bin", "PYTHONPATH": "/host", "SLURM_JOB_ID": "7"}, "/usr/bin"
    )
    assert env == {"PATH": "/usr/bin", "SLURM_JOB_ID": "7"}
    assert standin.image_path_variable('PATH="/opt/x/bin:/usr/bin"\n') == "/opt/x/bin:/usr/bin"
    assert standin.image_path_variable("") == standin.DEFAULT_PATH


def test_exit_status_is_passed_through_and_signals_become_128_plus_n():
    assert standin.exit_status(93) == 93
    assert standin.exit_status(0) == 0
    assert standin.exit_status(-15) == 143


def test_a_missing_mount_point_is_created_inside_the_unpacked_image(tmp_path):
    root = tmp_path / "root"
    (root / "var" / "lib").mkdir(parents=True)
    standin._mount_point(root, "/var/lib/cluster/work", is_file=False)
    standin._mount_point(root, "/etc/hosts", is_file=True)
    assert (root / "var/lib/cluster/work").is_dir()
    assert (root / "etc/hosts").is_file()


def test_a_mount_point_through_a_symlink_in_the_image_is_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "host-side"
    outside.mkdir()
    (root / "data").symlink_to(outside)  # absolute: it would resolve on the host
    with pytest.raises(StandinError, match="passes through a symlink"):
        standin._mount_point(root, "/data/work", is_file=False)
    assert not (outside / "work").exists()


def test_each_task_gets_private_tmp_run_and_home():
    assert standin.private_dirs("/root") == {
        "/tmp": "1777",
        "/var/tmp": "1777",
        "/run": "0755",
        "/root": "0700",
    }
    assert "/tmp/home" not in standin.private_dirs("/tmp/home")


def test_its_one_failure_line_in_the_jobs_output_carries_the_log_stamp(capsys):
    assert standin.main(["run", "--image", "/no/such/image.sqsh", "--", "true"]) == exitcodes.USAGE
    line = capsys.readouterr().err
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z nvrx-standin: --image ", line), line
