"""The job host's one helper module (jobhost/hostlib.py): what the teardown, the node
memory and the drain poller rely on when they read, append, call Slurm and log."""

from __future__ import annotations

import ast
import json
import os
import re
import sys
import threading
from pathlib import Path

import pytest

from nvrx_appliance.jobhost import hostlib


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("gpu[01-03,7],login1", ["gpu01", "gpu02", "gpu03", "gpu7", "login1"]),
        ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
        ("x[09-11]", ["x09", "x10", "x11"]),
        ("n[1,3-4]-ib", ["n1-ib", "n3-ib", "n4-ib"]),
        ("", []),
    ],
)
def test_slurms_host_lists_expand_to_every_host(nodelist, hosts):
    assert hostlib.expand_nodelist(nodelist) == hosts


def test_a_log_line_begins_with_the_utc_time_to_the_millisecond(capsys):
    hostlib.log("teardown", "released")
    line = capsys.readouterr().err
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z nvrx teardown: released\n", line
    ), line


def test_a_fifo_reads_as_absent_and_never_blocks(tmp_path):
    fifo = tmp_path / "tracker"
    os.mkfifo(fifo)
    found: list[str | None] = []
    reader = threading.Thread(target=lambda: found.append(hostlib.read_text(str(fifo), 64)))
    reader.start()
    reader.join(timeout=30)
    assert not reader.is_alive() and found == [None]


def test_a_tail_read_keeps_only_whole_lines_of_the_end(tmp_path):
    path = tmp_path / "ledger"
    path.write_bytes(b"first line\nsecond\xff line\nthird line\n")
    assert hostlib.read_text(str(path), 16, tail=True) == "third line\n"
    assert hostlib.read_text(str(path), 100) == "first line\nsecond\ufffd line\nthird line\n"


def test_a_short_append_raises_and_the_next_entry_stands_on_its_own_line(tmp_path, monkeypatch):
    record = tmp_path / "exclusions.jsonl"
    real_write = os.write
    # A full quota: the kernel takes part of the line and says so in os.write's result.
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[:10]))
    with pytest.raises(OSError, match="wrote 10 of"):
        hostlib.append_lines(str(record), [{"node": "node1"}])
    monkeypatch.setattr(os, "write", real_write)
    hostlib.append_lines(str(record), [{"node": "node2"}])
    assert hostlib.json_lines(record.read_text()) == [{"node": "node2"}]
    assert record.read_text().splitlines()[-1] == json.dumps({"node": "node2"})


def test_a_slurm_answer_in_any_encoding_is_text(tmp_path):
    tool = tmp_path / "sinfo"
    tool.write_bytes(b"#!/bin/sh\nprintf 'node1|fan \\342\\200\\223 80\\302\\260C \\377\\n'\n")
    tool.chmod(0o755)
    out, why = hostlib.slurm([str(tool)], timeout=30)
    assert (out, why) == ("node1|fan \u2013 80\u00b0C \ufffd\n", "")


def test_a_slurm_command_that_fails_or_is_missing_says_why(tmp_path):
    tool = tmp_path / "scancel"
    tool.write_text("#!/bin/sh\necho 'Invalid job id specified' >&2\nexit 1\n")
    tool.chmod(0o755)
    assert hostlib.slurm([str(tool)], timeout=30) == (
        None,
        f"{tool} exited 1: Invalid job id specified",
    )
    out, why = hostlib.slurm([str(tmp_path / "absent")], timeout=30)
    assert out is None and "could not run" in why


def test_every_host_file_is_python_36_and_imports_only_the_stdlib_and_its_siblings():
    # They run on the job host's own python3 (RHEL 8's is 3.6) beside each other, without
    # this package: a new file, or a move between them (the teardown's pure half went to
    # ending.py), must keep to both. ast checks the 3.6 grammar, not the library.
    here = Path(hostlib.__file__).parent
    siblings = {path.stem for path in here.glob("*.py")}
    for path in sorted(here.glob("*.py")):
        tree = ast.parse(path.read_text(), feature_version=(3, 6))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [(node.module or "").split(".")[0]]
            else:
                continue
            for name in names:
                assert name != "__future__", f"{path.name}: `from __future__` needs 3.7"
                assert name in sys.stdlib_module_names or name in siblings, (path.name, name)
