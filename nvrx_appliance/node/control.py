"""The per-generation control directory's contents: task 0's rendezvous record, and the
rules a peer applies before it trusts any control file.

Layout.control_files(array_job_id) names the files (layout.ControlFiles, SEAMS.md);
the rules live here as pure functions of what was read, so they are tested without a
file system.

Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from nvrx_appliance.jobhost import hostlib

RECORD_SCHEMA = "nvrx-appliance/rdzv"
RECORD_VERSION = 4  # 2: the record names its generation; 3: and the array throttle;
# 4: and where task 0 hears liveness beats, with their key

_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def generation(chain: str, array_job_id: str, submitted: str = "") -> str:
    """The identity every control file carries: which submission (run.json's chain id),
    which array job, and when Slurm accepted that array. Array job ids repeat (a rebuilt
    controller, a wrapped counter); the three together do not."""
    return f"{chain}/{array_job_id}/{submitted}"


# The one rule, shared with the teardown on the job's host.
same_generation = hostlib.same_generation


def encode_fields(fields: Mapping[str, object]) -> str:
    """A control file the batch script reads too (the closed flag, the no-restart
    witness): one `key=value` per line, which bash matches whole (`grep -x`) without
    parsing JSON. None is written empty; a line break in a value becomes a space."""
    lines = []
    for key, value in fields.items():
        text = "" if value is None else str(value)
        lines.append(f"{key}={' '.join(text.splitlines())}")
    return "\n".join(lines) + "\n"


def decode_fields(text: str) -> dict[str, str]:
    """`key=value` lines; a line without `=` is ignored, a repeated key keeps its first."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and key.strip() not in fields:
            fields[key.strip()] = value
    return fields


def named_generation(text: str) -> str | None:
    """The generation a control file names: a JSON object's (record, lease) or a
    `key=value` file's (closed flag, no-restart witness); None when it names none."""
    try:
        data = json.loads(text)
    except ValueError:
        return decode_fields(text).get("generation")
    theirs = data.get("generation") if isinstance(data, dict) else None
    return theirs if isinstance(theirs, str) else None


def foreign(text: str, ours: str) -> bool:
    """Does this control file name another generation than ours? Another run's closed
    flag, lease or record, left under a reused array job id, must be ignored, never
    obeyed. A file that names no generation is not foreign: the gate judges it."""
    theirs = named_generation(text)
    return theirs is not None and not same_generation(theirs, ours)


def names_ours(text: str, ours: str) -> bool:
    """Does this file say, itself, that it ends our generation? A closed flag or a
    no-restart witness is obeyed only then: one that names no generation (`{}`, or an
    older tool's) may be another run's, left under a reused array job id, and obeying it
    would end a new generation that is healthy. Every writer names the generation."""
    theirs = named_generation(text)
    return theirs is not None and same_generation(theirs, ours)


class RecordError(ValueError):
    """The rendezvous record cannot be trusted; the message says why, in one line."""


@dataclass(frozen=True)
class Record:
    """What task 0 publishes once per generation, and every other node joins on."""

    host: str  # task 0's host name: the rendezvous (TCP store) endpoint
    port: int
    segment: int | None  # the --ft-segment task 0 decided; None is simple hot-spare mode
    cluster_uuid: str | None  # task 0's ClusterUUID, for messages naming both nodes
    started: str  # ISO-8601 UTC: when task 0 started this generation
    array_job_id: str
    task_id: int
    job_id: str
    generation: str  # see generation(): a record of another run is never joined
    # The array throttle task 0 read from the controller (None: it could not): every
    # node sizes ft_launcher's --nnodes from it, and only task 0 asks Slurm for it.
    active_tasks: int | None = None
    # Task 0's liveness socket (UDP) and the generation's key for its beats, hex
    # (node/liveness.py); None: liveness is off in this chain.
    liveness_port: int | None = None
    liveness_key: str | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"


def encode(record: Record) -> str:
    body = {"schema": RECORD_SCHEMA, "version": RECORD_VERSION, **asdict(record)}
    return json.dumps(body, sort_keys=True) + "\n"


def hostname_problem(host: Any) -> str | None:
    """Why `host` is not something a peer may dial as task 0, or None if it is."""
    if not isinstance(host, str) or not host:
        return "host is missing"
    if len(host) > 253:
        return "host name is longer than 253 characters"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        if address.is_loopback or address.is_unspecified:
            return f"host {host!r} is a loopback address, which every node would take as itself"
        return None
    if host.rstrip(".").lower() == "localhost":
        return "host 'localhost' would make every node dial itself"
    if not all(_LABEL.match(label) for label in host.rstrip(".").split(".")):
        return f"host {host!r} is not a valid host name"
    return None


def decode(text: str) -> Record:
    """Parse and validate a record's text. Raises RecordError with one readable line."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("schema") != RECORD_SCHEMA:
        raise RecordError("not an nvrx-appliance rendezvous record (schema field missing)")
    if data.get("version") != RECORD_VERSION:
        raise RecordError(
            f"record version {data.get('version')!r} is not {RECORD_VERSION}; task 0 runs "
            "another nvrx-appliance version than this node"
        )
    problem = hostname_problem(data.get("host"))
    if problem:
        raise RecordError(problem)
    port = data.get("port")
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise RecordError(f"port {port!r} is not a TCP port 1-65535")
    segment = data.get("segment")
    if segment is not None and (
        not isinstance(segment, int) or isinstance(segment, bool) or segment < 1
    ):
        raise RecordError(f"segment {segment!r} is neither null nor a node count >= 1")
    for name in ("started", "array_job_id", "job_id", "generation"):
        if not isinstance(data.get(name), str) or not data[name]:
            raise RecordError(f"field {name!r} is missing or not a string")
    if data.get("task_id") != 0:
        raise RecordError(f"task_id {data.get('task_id')!r} is not 0: only task 0 publishes")
    cluster_uuid = data.get("cluster_uuid")
    if cluster_uuid is not None and not isinstance(cluster_uuid, str):
        raise RecordError("field 'cluster_uuid' is neither null nor a string")
    active = data.get("active_tasks")
    if active is not None and (
        not isinstance(active, int) or isinstance(active, bool) or active < 1
    ):
        raise RecordError(f"active_tasks {active!r} is neither null nor a task count >= 1")
    liveness_port = data.get("liveness_port")
    if liveness_port is not None and (
        not isinstance(liveness_port, int)
        or isinstance(liveness_port, bool)
        or not 1 <= liveness_port <= 65535
    ):
        raise RecordError(f"liveness_port {liveness_port!r} is neither null nor a UDP port")
    liveness_key = data.get("liveness_key")
    if liveness_key is not None and not _is_key(liveness_key):
        raise RecordError("liveness_key is neither null nor a hex key of 16 to 64 bytes")
    if (liveness_port is None) != (liveness_key is None):
        raise RecordError("liveness_port and liveness_key must be given together")
    return Record(
        host=data["host"],
        port=port,
        segment=segment,
        cluster_uuid=cluster_uuid,
        started=data["started"],
        array_job_id=data["array_job_id"],
        task_id=0,
        job_id=data["job_id"],
        generation=data["generation"],
        active_tasks=active,
        liveness_port=liveness_port,
        liveness_key=liveness_key,
    )


def _is_key(value: Any) -> bool:
    if not isinstance(value, str) or not 32 <= len(value) <= 128 or len(value) % 2:
        return False
    try:
        bytes.fromhex(value)
    except ValueError:
        return False
    return True


def dir_problem(*, mode: int, owner: int, uid: int, is_dir: bool) -> str | None:
    """Why the control directory must not be trusted, or None.

    Anyone who can write into it could publish a record that points every node of
    the generation at a host of their choosing, or close the generation.
    """
    if not is_dir:
        return "is not a directory (a symlink or a file is in its place)"
    if owner != uid:
        return f"is owned by uid {owner}, not by this job's user (uid {uid})"
    if mode & 0o022:
        return f"is group- or world-writable (mode {mode & 0o777:04o}); it must be 0700"
    return None


def file_problem(*, owner: int, uid: int, is_file: bool) -> str | None:
    """Why a control file (record, lease) must not be trusted, or None."""
    if not is_file:
        return "is not a regular file"
    if owner != uid:
        return f"is owned by uid {owner}, not by this job's user (uid {uid})"
    return None
