"""One writer per node puts its ranks' stack samples on the shared file system, one file
per node per period, and the judgement reads them back one sample per rank."""

from __future__ import annotations

import json

from nvrx_appliance.node import stack_publisher
from nvrx_appliance.rank import stacks


def _sample(rank: int, frame: str) -> dict:
    return {"rank": rank, "node": "node2", "frames": [{"name": frame, "file": "x.py", "line": 1}],
            "epoch": 1.0, "still_since": 1.0, "generation": "c/41/t", "cycle": 0}  # fmt: skip


def test_a_nodes_ranks_are_published_as_one_file_only_when_a_sample_changed(tmp_path):
    local, shared = tmp_path / "local", tmp_path / "shared" / "stacks"
    said: list[str] = []
    publisher = stack_publisher.Publisher(local, shared, "node2", 5.0, said.append)
    publisher.prepare()
    (local / "cycle0").mkdir()
    for rank in (2, 3):
        (local / "cycle0" / f"node2.rank{rank}.json").write_text(json.dumps(_sample(rank, "main")))
    assert publisher.publish() == 1
    assert sorted(p.name for p in (shared / "cycle0").iterdir()) == ["node2.json"]
    assert publisher.publish() == 0  # nothing changed: nothing written
    (local / "cycle0" / "node2.rank3.json").write_text(json.dumps(_sample(3, "all_reduce")))
    assert publisher.publish() == 1
    # The judgement reads one sample per rank, as from the guards' own files; a guard
    # without a publisher (its own file) is read beside them.
    (shared / "cycle0" / "node1.rank0.json").write_text(json.dumps(_sample(0, "step")))
    read = {s["rank"]: s["frames"][0]["name"] for s in stacks.read_samples(shared / "cycle0")}
    assert read == {0: "step", 2: "main", 3: "all_reduce"}
    publisher.stop()
    assert not local.exists() and said == []


def test_the_guards_keep_their_samples_in_the_node_local_directory_the_entrypoint_names(
    tmp_path, monkeypatch
):
    from nvrx_appliance.rank import sampler

    monkeypatch.setenv(stack_publisher.LOCAL_STACKS_ENV, str(tmp_path / "local"))
    s = sampler.Sampler(1, tmp_path / "shared" / "cycle3" / "node2.rank5.json", 5.0, {},
                        lambda _: None)  # fmt: skip
    assert s.path == tmp_path / "local" / "cycle3" / "node2.rank5.json"
    assert stack_publisher.local_dir("41", "node2").name == "41.node2"
