"""The one helper module of the code that runs on the job's host (the teardown, the node
memory, the drain poller): how it reads, writes, calls Slurm and logs.

Submit copies it beside them (Layout.hostlib); they import it by its name there, and as
nvrx_appliance.jobhost.hostlib inside the package, where anything may import it.

Every promise here holds for the teardown, which must end within Slurm's KillWait:
- a read is bounded and never blocks: opened with O_NONBLOCK, a FIFO or a device in a
  file's place is refused, not waited on; at most `limit` bytes (its first or its last);
  a byte that is not UTF-8 spoils only itself;
- a Slurm call is bounded by a timeout, and its output is decoded here, bytes with
  errors='replace': a drain reason in any encoding, under any locale (a Python 3.6 host
  in the C locale decodes text as ASCII), never raises;
- an append is one os.write of whole lines with O_APPEND, its count checked: a short
  write raises, and the next append starts on a line of its own, so a torn line never
  swallows the entry after it.

Why stdlib only, and Python 3.6 syntax: the host need not have this package, and its
python3 can be as old as RHEL 8's 3.6: no `from __future__ import annotations`, no builtin
generics or `X | Y` in annotations (typing's names instead), no subprocess
`capture_output`/`text`, no walrus.
"""

import datetime
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
from typing import Any, Dict, Iterable, List, Optional, Tuple

# The form of the times written into the ledger, the exclusion record and the control
# files, to the second: the package's clock.FORMAT, so that they compare as text.
RECORD_TIME = "%Y-%m-%dT%H:%M:%SZ"


def record_time(delta_s: float = 0) -> str:
    """Now (plus delta_s), as the records write a moment."""
    moment = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=delta_s)
    return moment.strftime(RECORD_TIME)


def log_time() -> str:
    """Now, as every log line of the appliance in a job's output begins: ISO 8601 in UTC
    with milliseconds and Z (the batch script's bash writes the same form)."""
    moment = datetime.datetime.now(datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def log(who: str, message: str) -> None:
    """One line to stderr (the job's output): the time, then "nvrx <who>: message"."""
    print(f"{log_time()} nvrx {who}: {message}", file=sys.stderr, flush=True)


# --- reading ------------------------------------------------------------------------


def read_text(path: str, limit: int, tail: bool = False) -> Optional[str]:
    """At most `limit` bytes of a regular file, its first or (tail) its last, as text;
    None when it is missing, not a regular file, or unreadable. Never blocks. A tail
    read that began inside a line drops that line's end rather than return half of it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError):  # ValueError: a NUL byte in the path
        return None
    chunks = []  # type: List[bytes]
    start = 0
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        start = max(0, st.st_size - limit) if tail else 0
        os.lseek(fd, start, os.SEEK_SET)
        left = limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    text = b"".join(chunks).decode("utf-8", errors="replace")
    if start > 0:
        text = text.partition("\n")[2]
    return text


def json_lines(text: str) -> List[Dict[str, Any]]:
    """The JSON objects of a JSON-lines text; a torn or foreign line is skipped."""
    entries = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def key_values(text: str) -> Dict[str, str]:
    """A control file's `key=value` lines; the first of a key wins."""
    fields = {}  # type: Dict[str, str]
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields.setdefault(key.strip(), value)
    return fields


def same_generation(theirs: str, ours: str) -> bool:
    """Do two generations (chain/array job id/submit time, as every control file names
    them) match? Chain and array job must; the submit time too, where both sides know it
    (a node whose scontrol call timed out does not)."""
    a, b = theirs.split("/"), ours.split("/")
    if len(a) != 3 or len(b) != 3 or a[:2] != b[:2]:
        return False
    return a[2] == b[2] or not a[2] or not b[2]


def submitted_ids(path: str) -> List[str]:
    """The array job ids submit recorded for the chain (submitted.json's job_ids)."""
    try:
        data = json.loads(read_text(path, 1 << 20) or "{}")
    except ValueError:
        return []
    ids = data.get("job_ids", []) if isinstance(data, dict) else []
    return [str(i) for i in ids if str(i).isdigit()] if isinstance(ids, list) else []


def untrusted(path: str, uid: int) -> Optional[str]:
    """Why a file must not steer this job (another user could have written it), or None.
    Missing is not untrusted: there is simply nothing to read."""
    try:
        st = os.lstat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not by this job's user (uid {uid})"
    if st.st_mode & 0o022:
        return f"is group- or world-writable (mode {st.st_mode & 0o777:04o})"
    return None


# --- writing ------------------------------------------------------------------------


def append_lines(path: str, entries: Iterable[Dict[str, Any]], mode: int = 0o600) -> None:
    """One JSON line per entry, appended by append_text."""
    append_text(path, "".join(json.dumps(entry, sort_keys=True) + "\n" for entry in entries), mode)


def append_text(path: str, text: str, mode: int = 0o600) -> None:
    """Append whole lines in one write with O_APPEND: a concurrent writer (the other
    teardown, nvrx-watch on another host) never splits a line. Raises OSError when the
    write fails or writes only part (a full quota): the caller says so."""
    if not text:
        return
    # Read and write: the last byte says whether the file ends a line.
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, mode)
    try:
        data = text.encode()
        if not _ends_a_line(fd):
            data = b"\n" + data  # an earlier short write left a torn line: end it first
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(f"wrote {written} of {len(data)} bytes to {path}")
    finally:
        os.close(fd)


def _ends_a_line(fd: int) -> bool:
    """Is the file empty, or does it end with a newline?"""
    size = os.fstat(fd).st_size
    return size == 0 or os.pread(fd, 1, size - 1) == b"\n"


def write_atomic(path: str, text: str) -> None:
    """Replace `path` by rename: a reader sees all of it or none. The temp file comes from
    mkstemp (O_EXCL, a random name, 0600), so nothing planted in the directory is opened."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix="." + os.path.basename(path))
    try:
        # Bytes, encoded here: a 3.6 host in the C locale would encode text as ASCII.
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8"))
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


# --- Slurm --------------------------------------------------------------------------


def slurm(argv: List[str], timeout: float) -> Tuple[Optional[str], str]:
    """(stdout, "") when the command succeeded; (None, why) when it could not run, did
    not answer within `timeout` seconds, or failed (its exit code and stderr in `why`)."""
    try:
        done = subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]} did not answer within {timeout:g} s"
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return None, f"{argv[0]} could not run ({exc})"
    out = done.stdout.decode("utf-8", errors="replace")
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", errors="replace").strip()
        return None, f"{argv[0]} exited {done.returncode}: {err}"
    return out, ""


# --- Slurm's host lists -------------------------------------------------------------


def expand_nodelist(text: str) -> List[str]:
    """Slurm's compressed host list, 'gpu[01-03,7],login1' -> gpu01 gpu02 gpu03 gpu7 login1."""
    hosts = []  # type: List[str]
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text or ""):
        hosts.extend(_expand(part.strip()))
    return [host for host in hosts if host]


def _expand(pattern: str) -> List[str]:
    match = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", pattern)
    if not match:
        return [pattern]
    head, ranges, tail = match.groups()
    found = []  # type: List[str]
    for item in ranges.split(","):
        low, _, high = item.partition("-")
        if high and low.isdigit() and high.isdigit():
            width = len(low)
            found.extend(head + str(n).zfill(width) for n in range(int(low), int(high) + 1))
        else:
            found.append(head + item)
    return [host for prefix in found for host in _expand(prefix + tail)]
