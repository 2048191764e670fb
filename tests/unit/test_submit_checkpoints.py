"""Submit refuses a checkpoints/ that every generation would refuse, with the words the
generation would use (checkpoint_dir.problem_at is the one judgement of both)."""

from __future__ import annotations

import dataclasses
import os

from nvrx_appliance.chain import probe
from nvrx_appliance.settings.validate import judge
from tests.unit.test_submit_validation import _spec


def _checkpoints_refusal(work):
    """What submit says of the work dir (tmp_path is node-local; the judgement of
    checkpoints/ is what is tested, so the work dir is taken as shared)."""
    spec = _spec(work_dir=str(work))
    facts = probe.gather(spec, with_slurm=False, user="alice")
    facts = dataclasses.replace(facts, work_dir_real="/shared/alice/run")
    [line] = [str(p) for p in judge(spec, facts) if p.option == "--work-dir"]
    return line


def test_submit_refuses_a_checkpoint_directory_every_generation_would_refuse(tmp_path):
    """A 0775 checkpoints/, a link to a group-writable project directory, one of another
    user: each would make every generation exit 72 until the burn guard stopped the chain."""
    work = tmp_path / "run"
    (work / "checkpoints").mkdir(parents=True)
    (work / "checkpoints").chmod(0o775)
    assert "mode 0775" in _checkpoints_refusal(work) and "chmod go-w" in _checkpoints_refusal(work)

    project = tmp_path / "project"
    project.mkdir(mode=0o770)
    project.chmod(0o770)
    (work / "checkpoints").rmdir()
    (work / "checkpoints").symlink_to(project)
    line = _checkpoints_refusal(work)
    assert "group- or world-writable (mode 0770)" in line and str(work / "checkpoints") in line

    project.chmod(0o700)
    os.chown(project, 12345, -1)
    assert "owned by uid 12345" in _checkpoints_refusal(work)


def test_submit_takes_a_private_checkpoint_directory_or_none_yet(tmp_path):
    work = tmp_path / "run"
    work.mkdir()
    assert (
        probe.gather(_spec(work_dir=str(work)), with_slurm=False, user="a").checkpoints_error
        is None
    )
    (work / "checkpoints").mkdir(mode=0o700)
    assert (
        probe.gather(_spec(work_dir=str(work)), with_slurm=False, user="a").checkpoints_error
        is None
    )


def test_submit_warns_of_earlier_checkpoints_the_tracked_record_never_named(tmp_path):
    """Such a work dir has nothing to fall back to: the first checkpoint that fails to
    load stops the chain. Submit says so, and how to vouch for one."""
    from nvrx_appliance.checkpoints import tracked_record
    from nvrx_appliance.settings.validate import unrecorded_warning

    checkpoints = tmp_path / "run" / "checkpoints"
    for iteration in (10, 20, 30):
        (checkpoints / f"iter_{iteration:07d}").mkdir(parents=True)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("30\n")
    spec = _spec(work_dir=str(tmp_path / "run"))
    facts = probe.gather(spec, with_slurm=False, user="alice")
    said = unrecorded_warning(spec, facts)
    assert said is not None
    assert "holds checkpoints before the tracked 30 (10, 20)" in said
    assert 'add a line {"tracked": 20} to checkpoints/tracked.jsonl' in said
    assert unrecorded_warning(dataclasses.replace(spec, checkpoint_fallbacks=0), facts) is None
    tracked_record.append(checkpoints / tracked_record.FILE, tracked_record.TRACKED, 20)
    assert unrecorded_warning(spec, probe.gather(spec, with_slurm=False, user="a")) is None
