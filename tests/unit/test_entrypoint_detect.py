"""ClusterUUID detection over recorded `nvidia-smi -q` texts, and the segment decision."""

import os
import stat
import time
from pathlib import Path

import pytest

from nvrx_appliance.node import detect, node_probe

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"


def fabric_of(name: str) -> detect.Fabric:
    return detect.fabric(detect.parse((FIXTURES / name).read_text()))


def test_a_gb200_tray_has_one_cluster_uuid_on_all_four_gpus():
    fabric = fabric_of("gb200-tray.txt")
    assert fabric.cluster_uuid == "6c1e2a07-93d4-4b58-a1f0-2d7e5b9c4e11"
    assert [g.bus_id for g in fabric.gpus] == [
        "00000008:01:00.0",
        "00000009:01:00.0",
        "00000018:01:00.0",
        "00000019:01:00.0",
    ]
    assert {g.name for g in fabric.gpus} == {"NVIDIA GB200"}


def test_an_hgx_h100_reports_all_zero_and_so_has_none():
    fabric = fabric_of("hgx-h100-all-zero.txt")
    assert not fabric.valid
    assert len(fabric.gpus) == 8
    assert "00000000-0000-0000-0000-000000000000" in fabric.reason


def test_an_h100_on_an_old_driver_without_the_line_has_none():
    fabric = fabric_of("h100-pcie-no-cluster-uuid.txt")
    assert not fabric.valid
    assert "no ClusterUUID line" in fabric.reason


def test_n_a_is_not_a_cluster_uuid():
    fabric = fabric_of("l40s-na.txt")
    assert not fabric.valid
    assert "N/A" in fabric.reason


def test_gpus_that_disagree_give_the_node_no_cluster_uuid():
    fabric = fabric_of("gb200-mixed.txt")
    assert not fabric.valid
    assert "disagree" in fabric.reason


def test_one_gpu_whose_fabric_is_not_ready_spoils_the_node():
    fabric = fabric_of("gb200-one-gpu-not-ready.txt")
    assert not fabric.valid
    assert "1 of 4 GPUs" in fabric.reason


def test_a_listing_that_lost_a_gpu_block_is_not_trusted():
    text = (FIXTURES / "gb200-tray.txt").read_text()
    cut = text.index("GPU 00000019:01:00.0")
    fabric = detect.fabric(detect.parse(text[:cut]))
    assert not fabric.valid
    assert "reports 4 GPUs but 3" in fabric.reason


def test_empty_output_means_no_gpus():
    assert detect.fabric(detect.parse("")).reason == "nvidia-smi -q listed no GPUs"


@pytest.mark.parametrize(
    ("setting", "fixture", "segment"),
    [
        ("auto", "gb200-tray.txt", 1),
        ("auto", "hgx-h100-all-zero.txt", None),
        ("auto", "l40s-na.txt", None),
        ("off", "gb200-tray.txt", None),
        ("2", "gb200-tray.txt", 2),
    ],
)
def test_the_segment_decision_follows_the_setting_and_task_0s_gpus(setting, fixture, segment):
    assert detect.decide(setting, fabric_of(fixture)).segment == segment


def test_an_explicit_segment_on_a_node_without_cluster_uuid_is_refused_not_passed():
    with pytest.raises(detect.SegmentError, match="--segment auto"):
        detect.decide("1", fabric_of("hgx-h100-all-zero.txt"))


def test_a_peer_without_cluster_uuid_cannot_join_segment_mode():
    here = fabric_of("l40s-na.txt")
    assert "no ClusterUUID" in detect.disagreement(1, here)
    assert detect.disagreement(None, here) is None
    assert detect.disagreement(1, fabric_of("gb200-tray.txt")) is None


# --- the nvidia-smi adapter, against stand-in executables (there is no GPU here) -------


def _fake_nvidia_smi(tmp_path, monkeypatch, body: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_the_probe_reads_what_nvidia_smi_prints(tmp_path, monkeypatch):
    _fake_nvidia_smi(tmp_path, monkeypatch, f'cat "{FIXTURES / "gb200-tray.txt"}"\n')
    assert node_probe.node_fabric().cluster_uuid == "6c1e2a07-93d4-4b58-a1f0-2d7e5b9c4e11"


def test_a_missing_nvidia_smi_means_no_cluster_uuid(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    fabric = node_probe.node_fabric()
    assert not fabric.valid
    assert "not on PATH" in fabric.reason


def test_a_failing_nvidia_smi_means_no_cluster_uuid(tmp_path, monkeypatch):
    _fake_nvidia_smi(
        tmp_path,
        monkeypatch,
        "echo 'NVIDIA-SMI has failed because it couldn''t communicate' >&2\nexit 9\n",
    )
    fabric = node_probe.node_fabric()
    assert not fabric.valid
    assert "exited 9" in fabric.reason


def test_a_hanging_nvidia_smi_is_cut_off_at_the_bound(tmp_path, monkeypatch):
    # The child of the stand-in keeps stdout open: the bound must not wait for it.
    _fake_nvidia_smi(tmp_path, monkeypatch, "sleep 60 &\nsleep 60\n")
    start = time.monotonic()
    fabric = node_probe.node_fabric(timeout=1)
    assert time.monotonic() - start < 5
    assert not fabric.valid
    assert "did not answer within 1 s" in fabric.reason
