"""A rebuild of the local cluster (`cluster up` with other settings) keeps the work root:
every run's work dir (checkpoints, logs, reports) lives there. `down` removes it all."""

from __future__ import annotations

from pathlib import Path

from nvrx_appliance.devcluster.cluster import remove_root
from nvrx_appliance.devcluster.plan import Paths


def _cluster_root(tmp_path: Path) -> Paths:
    paths = Paths(tmp_path / "devcluster")
    for directory in (paths.etc, paths.mysql_data, paths.spool, paths.nvidia_smi_dir):
        directory.mkdir(parents=True)
    paths.marker.write_text("ours\n")
    paths.state.write_text("{}\n")
    paths.slurm_conf.write_text("ClusterName=x\n")
    run = paths.work_root / "demo-20261203" / "checkpoints"
    run.mkdir(parents=True)
    (run / "latest_checkpointed_iteration.txt").write_text("40\n")
    return paths


def test_a_rebuild_removes_the_cluster_but_keeps_every_runs_work_dir(tmp_path):
    paths = _cluster_root(tmp_path)
    remove_root(paths, keep_work=True)
    tracker = (
        paths.work_root / "demo-20261203" / "checkpoints" / "latest_checkpointed_iteration.txt"
    )
    assert tracker.read_text() == "40\n"
    # The marker stays, so the root is still ours if the rebuild stops half-way.
    assert sorted(p.name for p in paths.root.iterdir()) == sorted(
        [paths.marker.name, paths.work_root.name]
    )


def test_down_removes_the_whole_root(tmp_path):
    paths = _cluster_root(tmp_path)
    remove_root(paths, keep_work=False)
    assert not paths.root.exists()
