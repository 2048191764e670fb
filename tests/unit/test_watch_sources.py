"""The file sources, against real cycle-info files written by ft_launcher 0.7.0
(fixtures/watch/record_cycle_infos.sh) laid out as the appliance's work dir holds them."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from nvrx_appliance.observe.times import parse_time
from nvrx_appliance.watch import persistence, readers
from nvrx_appliance.watch.readers import CycleReader, ReadError

FIXTURES = Path(__file__).parent / "fixtures" / "watch"


def work_dir(tmp_path: Path) -> Path:
    """Two generations as the appliance lays them out: 4242 restarted once, 4343 was killed."""
    for name, job in (("two_cycles", "4242"), ("killed", "4343")):
        target = tmp_path / "nvrx" / job / "cycle_infos"
        target.mkdir(parents=True)
        for item in (FIXTURES / name).iterdir():
            shutil.copy(item, target / item.name, follow_symlinks=False)
    return tmp_path


def pattern(work: Path) -> str:
    return str(work / "nvrx" / "*" / "cycle_infos" / "cycle_info.*")


def test_real_cycle_info_files_become_cycles_in_start_order(tmp_path):
    scan = CycleReader(pattern(work_dir(tmp_path))).scan()
    assert [c.key for c in scan.cycles] == ["4242.0.0", "4242.0.1", "4343.0.0"]
    restarted, resumed, killed = scan.cycles
    assert restarted.end is not None and resumed.end is not None and restarted.end <= resumed.start
    assert killed.end is None  # SIGKILL: the last cycle never records its end
    assert restarted.active_nodes == "localhost" and restarted.standby_nodes == ""
    raw = json.loads((FIXTURES / "two_cycles" / "cycle_info.4242.0.1").read_text())
    assert resumed.start == parse_time(raw["cycle_start_time"])
    assert scan.skipped == 0  # the .current symlinks are not read as a second copy


def test_a_file_unchanged_since_the_last_pass_is_not_parsed_again(tmp_path):
    work = work_dir(tmp_path)
    reader = CycleReader(pattern(work))
    reader.scan()
    second = reader.scan()
    assert (second.parsed, second.reused) == (0, 3)
    # Same inode, size and mtime, different bytes: the reader trusts its cache.
    path = work / "nvrx" / "4343" / "cycle_infos" / "cycle_info.4343.0.0"
    stat = path.stat()
    text = path.read_text()
    path.write_text(text.replace('"cycle_number": 0', '"cycle_number": 7'))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert [c.number for c in reader.scan().cycles] == [0, 1, 0]


def test_a_cycle_closed_by_nvrx_after_the_last_pass_is_read_again(tmp_path):
    work = work_dir(tmp_path)
    reader = CycleReader(pattern(work))
    assert reader.scan().cycles[-1].end is None
    path = work / "nvrx" / "4343" / "cycle_infos" / "cycle_info.4343.0.0"
    data = json.loads(path.read_text())
    data["cycle_end_time"] = "2026-11-30T18:09:00.000000Z"
    tmp = path.with_name(path.name + ".tmp")  # NVRx updates by temp file + rename
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)
    scan = reader.scan()
    assert scan.parsed == 1 and scan.cycles[-1].end == parse_time("2026-11-30T18:09:00Z")


def test_half_written_and_foreign_files_are_skipped_never_a_crash(tmp_path):
    work = work_dir(tmp_path)
    directory = work / "nvrx" / "4444" / "cycle_infos"
    directory.mkdir(parents=True)
    real = (FIXTURES / "two_cycles" / "cycle_info.4242.0.0").read_text()
    (directory / "cycle_info.4444.0.0").write_text(real[: len(real) // 2])  # NVRx writes in place
    (directory / "cycle_info.4444.0.1").write_text('{"hello": "world"}')
    (directory / "cycle_info.4444.0.2").write_text("[1, 2, 3]")
    (directory / "cycle_info.4444.0.3").write_bytes(b"\xff\xfe\x00garbage")
    (directory / "cycle_info.4444.0.4").write_text(
        '{"job_id": "4444", "cycle_number": "x", "cycle_start_time": "now"}'
    )
    (directory / "cycle_info.4444.0.5").mkdir()
    (directory / "cycle_info.4444.0.6.tmp").write_text(real)  # a writer's temp file
    reader = CycleReader(pattern(work))
    scan = reader.scan()
    assert [c.key for c in scan.cycles] == ["4242.0.0", "4242.0.1", "4343.0.0"]
    assert scan.skipped == 5
    # Once NVRx finishes writing, the next pass picks it up.
    (directory / "cycle_info.4444.0.0").write_text(real.replace('"4242"', '"4444"'))
    assert "4444.0.0" in [c.key for c in reader.scan().cycles]


def test_a_cycle_info_file_swapped_for_a_fifo_after_the_listing_does_not_block_the_pass(
    tmp_path, monkeypatch
):
    # Between the listing (a regular file) and the open, the file is replaced by a FIFO:
    # a blocking open waited for a writer, and the pass hung for hours.
    import threading

    work = work_dir(tmp_path)
    victim = work / "nvrx" / "4343" / "cycle_infos" / "cycle_info.4343.0.0"
    listed = readers._files

    def swap_after_listing(directory, name_pattern):
        for name, stat in listed(directory, name_pattern):
            if os.path.join(directory, name) == str(victim):
                victim.unlink()
                os.mkfifo(victim)
            yield name, stat

    monkeypatch.setattr(readers, "_files", swap_after_listing)
    found: list = []
    scanning = threading.Thread(target=lambda: found.append(CycleReader(pattern(work)).scan()))
    scanning.start()
    scanning.join(timeout=10)
    if scanning.is_alive():  # release the blocked open, then fail
        os.close(os.open(victim, os.O_WRONLY | os.O_NONBLOCK))
        scanning.join(timeout=10)
        pytest.fail("the scan blocked on a FIFO")
    assert [c.key for c in found[0].cycles] == ["4242.0.0", "4242.0.1"]


def test_no_cycle_info_directory_yet_is_no_cycles_not_an_error(tmp_path):
    assert CycleReader(pattern(tmp_path / "fresh")).scan().cycles == ()


def test_the_checkpoint_tracker_value_and_when_it_was_written(tmp_path):
    tracker = tmp_path / "latest_checkpointed_iteration.txt"
    assert readers.read_checkpoint(str(tracker)).value is None
    tracker.write_text("1200\n")
    os.utime(tracker, (1_800_000_000, 1_800_000_000))
    checkpoint = readers.read_checkpoint(str(tracker))
    assert (checkpoint.value, checkpoint.mtime) == (1200, 1_800_000_000)
    tracker.write_text("release")
    assert readers.read_checkpoint(str(tracker)).value is None


def test_a_tracker_glob_reads_the_most_recently_written_match(tmp_path):
    for job, value, mtime in (("1", "5", 100), ("2", "9", 300), ("3", "7", 200)):
        (tmp_path / job).mkdir()
        (tmp_path / job / "iter.txt").write_text(value)
        os.utime(tmp_path / job / "iter.txt", (mtime, mtime))
    assert readers.read_checkpoint(str(tmp_path / "*" / "iter.txt")).value == 9


def test_a_tracker_that_exists_but_cannot_be_read_is_an_error(tmp_path):
    (tmp_path / "iter.txt").mkdir()
    with pytest.raises(ReadError, match="checkpoint tracker"):
        readers.read_checkpoint(str(tmp_path / "iter.txt"))


def test_the_ledger_skips_a_torn_last_line(tmp_path):
    ledger = tmp_path / "chain.jsonl"
    ledger.write_text(
        json.dumps(
            {
                "array_job_id": "37",
                "job_name": "c",
                "end": "2026-11-30T18:00:00Z",
                "exit_code": 93,
                "action": "cancelled_chain",
                "reason": "NVRx: no progress",
            }
        )
        + "\n"
        + '{"array_job_id": "38", "exit_co'
    )
    [entry] = readers.read_ledger(str(ledger))
    assert (entry.array_job_id, entry.exit_code, entry.action) == ("37", 93, "cancelled_chain")
    assert entry.end == parse_time("2026-11-30T18:00:00Z")
    assert readers.read_ledger(str(tmp_path / "missing.jsonl")) == ()


def test_the_next_process_reuses_the_cycle_cache_and_losing_it_costs_only_a_reread(tmp_path):
    work = work_dir(tmp_path / "run")
    cache_dir = str(tmp_path / "state" / "cycles" / "run")
    first = CycleReader(pattern(work))
    first.scan()
    persistence.save_cycle_cache(cache_dir, first.cache, first.changed)
    second = CycleReader(pattern(work), persistence.load_cycle_cache(cache_dir)).scan()
    assert (second.parsed, second.reused) == (0, 3)
    for path in Path(cache_dir).iterdir():
        path.write_text("{ torn")  # a crash mid-write, or a disk that lost it
    third = CycleReader(pattern(work), persistence.load_cycle_cache(cache_dir)).scan()
    assert (third.parsed, [c.key for c in third.cycles]) == (
        3,
        [c.key for c in first.scan().cycles],
    )


def test_a_generation_directory_removed_from_disk_leaves_the_cache(tmp_path):
    work = work_dir(tmp_path / "run")
    cache_dir = str(tmp_path / "cache")
    reader = CycleReader(pattern(work))
    reader.scan()
    persistence.save_cycle_cache(cache_dir, reader.cache, reader.changed)
    shutil.rmtree(work / "nvrx" / "4242")
    reader.changed = set()
    assert [c.key for c in reader.scan().cycles] == ["4343.0.0"]
    persistence.save_cycle_cache(cache_dir, reader.cache, reader.changed)
    assert list(persistence.load_cycle_cache(cache_dir)) == [
        str(work / "nvrx" / "4343" / "cycle_infos")
    ]


def nvrx_create(directory: Path, name: str, text: str) -> None:
    """What NVRx's CycleInfoWriter does for a new cycle: write the file in place, then
    point the .current symlink at it by rename."""
    (directory / name).write_text(text)
    job = name.split(".")[1]
    tmp = directory / f"cycle_info.{job}.current.tmp"
    os.symlink(name, tmp)
    os.replace(tmp, directory / f"cycle_info.{job}.current")


def test_a_directory_nvrx_has_not_touched_since_it_settled_is_not_listed_again(tmp_path):
    work = work_dir(tmp_path)
    later = time.time() + 60  # every stamp is old by then: trusted
    reader = CycleReader(pattern(work), clock=lambda: later)
    assert reader.scan().listed == 2
    again = reader.scan()
    assert (again.listed, again.parsed, len(again.cycles)) == (0, 0, 3)


def test_a_stamp_too_fresh_to_trust_is_listed_again(tmp_path):
    work = work_dir(tmp_path)
    reader = CycleReader(pattern(work), clock=time.time)  # just written: not settled yet
    reader.scan()
    assert reader.scan().listed == 2


def test_every_write_nvrx_makes_moves_the_directory_and_is_seen(tmp_path):
    work = work_dir(tmp_path)
    directory = work / "nvrx" / "4343" / "cycle_infos"
    os.utime(directory, (1_700_000_000, 1_700_000_000))  # an old, settled generation
    reader = CycleReader(pattern(work), clock=time.time)
    reader.scan()
    assert reader.scan().listed == 1  # only the freshly copied 4242 directory
    # A rendezvous re-forming in that generation writes cycle 0 again, in place.
    data = json.loads((directory / "cycle_info.4343.0.0").read_text())
    data["cycle_start_time"] = "2026-12-01T09:30:00Z"
    nvrx_create(directory, "cycle_info.4343.0.0", json.dumps(data, indent=2))
    scan = reader.scan()
    assert scan.parsed == 1
    assert scan.cycles[-1].start == parse_time("2026-12-01T09:30:00Z")
