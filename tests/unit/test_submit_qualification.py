"""submit --image and the image's qualification record: said once, recorded, never refused."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.cli.main import cli
from nvrx_appliance.image import qualification as q
from nvrx_appliance.image import qualification_status
from nvrx_appliance.node import preflight
from tests.unit.images import cpu_manifest, needs_squashfs, squash_image

IMAGE = "/images/nvrx-appliance-0.1.0_nvrx-0.7.0_debian-12.sqsh"
RECORD = IMAGE + q.RECORD_SUFFIX
FINISHED = "2026-12-01T09:30:00Z"
ALL_PASSED = [
    q.Check(q.CHECKPOINT_BEFORE_FAULT, True, "checkpoint 10"),
    q.Check(q.RESUMED_EXACTLY, True, "resumed at 10"),
    q.Check(q.TRAINING_WENT_ON, True, "checkpoint 15"),
]


def _record(manifest, checks=ALL_PASSED, cluster="alps"):
    return q.record(
        image=IMAGE,
        image_manifest=manifest,
        checks=checks,
        cluster={"cluster_name": cluster, "partition": "debug"},
        chain={},
        started="2026-12-01T09:00:00Z",
        finished=FINISHED,
        tool_version="0.1.0",
    )


def _assess(record, cluster="alps", manifest=None):
    manifest = manifest or cpu_manifest()
    return qualification_status.assess(manifest, record, record_path=RECORD, cluster=cluster)


# --- the decision ----------------------------------------------------------------------


def test_no_record_warns_naming_the_image_its_versions_and_the_qualify_command():
    found = _assess(None)
    assert found.status == qualification_status.NONE
    text = qualification_status.message(IMAGE, cpu_manifest(), found)
    lines = text.splitlines()
    assert lines[0] == lines[-1] == qualification_status.RULE  # one marked block
    assert text.count("WARNING:") == 1
    assert (
        "WARNING: image nvrx-appliance-0.1.0_nvrx-0.7.0_debian-12.sqsh "
        "(NVRx 0.7.0, Megatron-LM unknown, PyTorch 2.13.0+cpu," in text
    )
    assert "has no qualification record on this cluster" in text
    assert f"(none at {RECORD})" in text
    assert f"`nvrx-appliance qualify --image {IMAGE} [your submit options]`" in text
    assert "a dry run is not evidence of recovery" in text


def test_a_passed_record_for_the_same_combination_is_one_line_naming_when_and_where():
    found = _assess(_record(cpu_manifest()))
    assert (found.status, found.date, found.cluster) == (
        qualification_status.PASSED,
        FINISHED,
        "alps",
    )
    text = qualification_status.message(IMAGE, cpu_manifest(), found)
    assert text == (
        f"image nvrx-appliance-0.1.0_nvrx-0.7.0_debian-12.sqsh: qualified on {FINISHED} "
        f"on cluster alps (record {RECORD})"
    )


def test_a_record_for_another_combination_counts_as_none():
    # The same file name, rebuilt with another PyTorch after it was qualified.
    rebuilt = cpu_manifest(pytorch="2.14.0+cpu")
    found = _assess(_record(cpu_manifest()), manifest=rebuilt)
    assert found.status == qualification_status.NONE
    assert "is for another combination: NVRx 0.7.0, Megatron-LM unknown, PyTorch 2.13.0" in (
        found.why
    )
    assert "WARNING:" in qualification_status.message(IMAGE, rebuilt, found)


def test_a_rebuild_of_the_same_combination_keeps_its_qualification():
    later = cpu_manifest(built="2027-01-01")
    assert _assess(_record(cpu_manifest()), manifest=later).status == qualification_status.PASSED


def test_a_failed_qualification_warns_with_the_check_that_failed():
    checks = [ALL_PASSED[0], q.Check(q.RESUMED_EXACTLY, False, "resumed at 5, not 10")]
    found = _assess(_record(cpu_manifest(), checks=checks))
    assert found.status == qualification_status.FAILED
    text = qualification_status.message(IMAGE, cpu_manifest(), found)
    assert f"FAILED its qualification on {FINISHED} on cluster alps" in text
    assert "successor resumed from exactly that iteration: resumed at 5, not 10" in text
    assert text.count("WARNING:") == 1


def test_a_record_from_another_cluster_does_not_vouch_here():
    found = _assess(_record(cpu_manifest(), cluster="alps"), cluster="todi")
    assert found.status == qualification_status.NONE
    assert found.why == "it was qualified on cluster alps, not on todi"


def test_without_slurm_the_cluster_cannot_be_compared_and_the_record_stands():
    assert _assess(_record(cpu_manifest()), cluster="").status == qualification_status.PASSED


@pytest.mark.parametrize("record", ["not json's dict", ["a", "list"], {"schema": "other"}])
def test_something_else_where_the_record_should_be_counts_as_none(record):
    assert _assess(record).status == qualification_status.NONE


# --- run.json --------------------------------------------------------------------------


def test_run_json_carries_the_qualification_status_under_the_image_and_the_entrypoint_reads_it(
    tmp_path,
):
    from nvrx_appliance.settings.chain import ChainSpec

    found = _assess(None)
    image = {**cpu_manifest(), qualification_status.KEY: found.to_json()}
    spec = ChainSpec(work_dir=str(tmp_path), workload="cpu", image=IMAGE, runtime="pyxis")
    path = run_manifest.save(run_manifest.build(spec, created="c", user="alice", image=image))
    loaded = preflight.load(path)  # what nvrx-entrypoint does first on every node
    assert loaded.image[qualification_status.KEY]["status"] == "none"
    assert qualification_status.image_manifest(loaded.image) == cpu_manifest()


# --- submit, for real, with a real image file --------------------------------------------


def _submit_dry_run(tmp_path, image, *extra):
    args = ["submit", "--image", str(image), "--runtime", "pyxis", "--workload", "cpu"]
    args += ["--work-dir", "/shared/qualification-test", "--dry-run", *extra]
    # No reachable Slurm: SLURM_CONF names a file that does not exist.
    return CliRunner().invoke(cli, args, env={"SLURM_CONF": str(tmp_path / "none.conf")})


@needs_squashfs
def test_submit_without_a_record_warns_once_and_still_submits(tmp_path):
    image = squash_image(tmp_path, cpu_manifest(), name="appliance.sqsh")
    result = _submit_dry_run(tmp_path, image)
    assert result.exit_code == 0, result.output
    assert result.stderr.count("WARNING:") == 1
    assert result.stderr.count(qualification_status.RULE) == 2
    assert "WARNING: image appliance.sqsh (NVRx 0.7.0," in result.stderr
    assert f"nvrx-appliance qualify --image {image}" in result.stderr
    assert "sbatch" in result.stdout  # the plan is shown all the same


@needs_squashfs
def test_submit_json_keeps_stdout_machine_readable_and_carries_the_qualification_status(tmp_path):
    image = squash_image(tmp_path, cpu_manifest(), name="appliance.sqsh")
    result = _submit_dry_run(tmp_path, image, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["image_qualification"]["status"] == "none"
    assert doc["image_qualification"]["record"] == str(q.record_path(image))
    assert result.stderr.count("WARNING:") == 1


@needs_squashfs
def test_submit_with_a_passed_record_next_to_the_image_says_one_line(tmp_path):
    image = squash_image(tmp_path, cpu_manifest(), name="appliance.sqsh")
    q.record_path(image).write_text(json.dumps(_record(cpu_manifest())))
    result = _submit_dry_run(tmp_path, image)
    assert result.exit_code == 0, result.output
    assert "WARNING" not in result.stderr
    [line] = [x for x in result.stderr.splitlines() if "appliance.sqsh" in x]
    assert line == (
        f"image appliance.sqsh: qualified on {FINISHED} on cluster alps "
        f"(record {q.record_path(image)})"
    )


@needs_squashfs
def test_submit_with_a_record_of_another_build_warns(tmp_path):
    image = squash_image(tmp_path, cpu_manifest(nvrx="0.6.0"), name="appliance.sqsh")
    q.record_path(image).write_text(json.dumps(_record(cpu_manifest())))
    result = _submit_dry_run(tmp_path, image)
    assert result.exit_code == 0, result.output
    assert result.stderr.count("WARNING:") == 1
    assert "is for another combination" in result.stderr
