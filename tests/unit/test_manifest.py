"""run.json: what the entrypoint refuses before it publishes anything."""

import json

import pytest

from nvrx_appliance import manifest
from nvrx_appliance.settings.chain import ChainSpec


def _good(tmp_path):
    spec = ChainSpec(
        work_dir=str(tmp_path), train_tasks=2, hot_spares=1, cold_spares=2, gpus_per_node=2
    )
    return manifest.build(spec, created="2026-11-30T00:00:00Z", user="alice")


def test_a_saved_manifest_loads_back_with_the_same_shape(tmp_path):
    m = _good(tmp_path)
    path = manifest.save(m)
    loaded = manifest.load(path)
    assert loaded.spec == m.spec
    assert loaded.shape.array_spec == "0-4%3"
    assert (loaded.shape.min_nodes, loaded.shape.max_nodes) == (2, 3)


def test_a_missing_manifest_is_named(tmp_path):
    with pytest.raises(manifest.ManifestError, match="does not exist"):
        manifest.load(tmp_path / "run.json")


def test_a_manifest_that_is_not_json_is_refused(tmp_path):
    (tmp_path / "run.json").write_text("{half")
    with pytest.raises(manifest.ManifestError, match="not valid JSON"):
        manifest.load(tmp_path / "run.json")


def test_an_unreadable_manifest_is_refused(tmp_path):
    # A directory in its place: unreadable even for root, which ignores file modes.
    path = tmp_path / "run.json"
    path.mkdir()
    with pytest.raises(manifest.ManifestError, match="unreadable"):
        manifest.load(path)


def test_an_unknown_version_is_refused_not_guessed(tmp_path):
    data = _good(tmp_path).to_json() | {"version": 99}
    with pytest.raises(manifest.ManifestError, match="version 99 is not supported"):
        manifest.parse(data)


def test_another_entrypoint_protocol_is_refused(tmp_path):
    data = _good(tmp_path).to_json() | {"protocol": 0}
    with pytest.raises(manifest.ManifestError, match="protocol"):
        manifest.parse(data)


def test_a_spec_whose_batch_does_not_divide_is_inconsistent(tmp_path):
    data = _good(tmp_path).to_json()
    data["spec"]["global_batch"] = 3  # world 4, micro batch 1: not a multiple of 4
    with pytest.raises(manifest.ManifestError, match="global-batch"):
        manifest.parse(data)


def test_a_hand_edited_shape_is_refused(tmp_path):
    data = _good(tmp_path).to_json()
    data["shape"]["max_nodes"] = 1  # min nodes 2 > max nodes 1
    with pytest.raises(manifest.ManifestError, match="shape does not match"):
        manifest.parse(data)


def test_unknown_settings_are_refused(tmp_path):
    data = _good(tmp_path).to_json()
    data["spec"]["train_taks"] = 2
    with pytest.raises(manifest.ManifestError, match="train_taks"):
        manifest.parse(data)


def test_the_modes_policy_is_decided_at_submit_and_read_back_from_run_json(tmp_path):
    spec = ChainSpec(work_dir=str(tmp_path), mode="no-restart", max_no_progress_cycles=3)
    saved = manifest.save(manifest.build(spec, created="2026-11-30T00:00:00Z", user="alice"))
    written = json.loads(saved.read_text())["policy"]
    assert written == {
        "progress_file": str(tmp_path / "static_iteration.txt"),
        "progress_frozen": True,
        "max_no_progress_cycles": 1,
        "faults_active": True,
        "gpu_failure": None,
        "checkpoints_kept": 3,  # a Megatron chain: task 0 keeps its --save-retention
        # Megatron's own verdicts become the chain's (settings/exit_actions.py).
        "exit_actions": {"16": "resume-elsewhere", "17": "stop-chain"},
        "checkpoint_fallbacks": 2,
    }
    assert manifest.load(saved).policy.progress_file == written["progress_file"]


def test_the_entrypoint_obeys_the_written_policy_not_the_mode(tmp_path):
    # The policy is a value in run.json: a reader never re-derives it from the mode.
    path = manifest.save(_good(tmp_path))
    data = json.loads(path.read_text())
    data["policy"]["max_no_progress_cycles"] = 7
    path.write_text(json.dumps(data))
    assert manifest.load(path).policy.max_no_progress_cycles == 7


@pytest.mark.parametrize(
    "policy",
    [None, {}, {"progress_file": "x"}, "train"],
)
def test_a_manifest_without_a_well_formed_policy_is_refused(tmp_path, policy):
    path = manifest.save(_good(tmp_path))
    data = json.loads(path.read_text())
    data["policy"] = policy
    path.write_text(json.dumps(data))
    with pytest.raises(manifest.ManifestError, match="policy"):
        manifest.load(path)


def test_a_policy_field_of_the_wrong_type_is_named(tmp_path):
    path = manifest.save(_good(tmp_path))
    data = json.loads(path.read_text())
    data["policy"]["max_no_progress_cycles"] = True
    path.write_text(json.dumps(data))
    with pytest.raises(manifest.ManifestError, match="max_no_progress_cycles"):
        manifest.load(path)
