"""run.json: the run manifest.

The manifest is the contract between submit (which writes it once), the entrypoint
(which reads it on every node of every generation), `status` and the watcher. It is
versioned; a reader refuses a version it does not know rather than guess. Where its
files lie in the work directory is layout.py's.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nvrx_appliance import ENTRYPOINT_PROTOCOL, __version__
from nvrx_appliance.files import read_text, write_atomic
from nvrx_appliance.layout import Layout
from nvrx_appliance.settings import declared
from nvrx_appliance.settings import policy as mode_policy
from nvrx_appliance.settings.chain import ChainSpec, Shape, check, derive, from_dict, to_dict
from nvrx_appliance.settings.megatron.rules import WANDB_RUN_ID, wandb_run_id
from nvrx_appliance.settings.policy import Policy
from nvrx_appliance.settings.program_argv import program_argv

SCHEMA = "nvrx-appliance/run"
# 2: the workload's program argv, computed once at submit, is in run.json.
# 3: so is the mode's policy (settings/policy.py): the entrypoint reads it, never the mode.
# 4: the parallel shape (TP, PP, CP, EP, ETP, virtual stages, microbatches), who keeps
#    checkpoints (policy.checkpoints_kept) and the chain's one W&B run (wandb).
# 5: the workload's exit table and checkpoint fall-backs (policy), and the checkpoint
#    the chain started from (checkpoint_start).
VERSION = 5


class ManifestError(Exception):
    """run.json is missing, unreadable, of an unknown version, or inconsistent."""


@dataclass(frozen=True)
class Manifest:
    spec: ChainSpec
    shape: Shape
    policy: Policy  # what the mode means, decided at submit
    image: dict[str, Any] | None  # the image's own manifest, when there is an image
    created: str  # ISO-8601 UTC, at submit
    user: str
    tool_version: str = __version__
    protocol: int = ENTRYPOINT_PROTOCOL
    # What ft_launcher runs on every rank after the interpreter (build computes it with
    # settings/program_argv.py; the entrypoint only reads it).
    workload: tuple[str, ...] = ()
    # The chain's one W&B run ("" without --wandb-project): every generation and every
    # in-job restart logs to it (node/env.py sets WANDB_RUN_ID, WANDB_RESUME).
    wandb_run_id: str = ""
    # The tracked iteration when the chain was submitted (None: none): a checkpoint that
    # cannot be loaded is never replaced by one older than this (checkpoints/fallback.py).
    checkpoint_start: int | None = None

    @property
    def layout(self) -> Layout:
        return Layout(Path(self.spec.work_dir))

    @property
    def chain_id(self) -> str:
        """What tells this submission from any other in the same work dir: the ledger
        files entries under it, and every control file of its generations names it."""
        return self.created

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "protocol": self.protocol,
            "tool_version": self.tool_version,
            "created": self.created,
            "user": self.user,
            "spec": to_dict(self.spec),
            "shape": asdict(self.shape),
            "policy": asdict(self.policy),
            "image": self.image,
            "workload": list(self.workload),
            "wandb": {"run_id": self.wandb_run_id} if self.wandb_run_id else None,
            "checkpoint_start": self.checkpoint_start,
            # For the host code (jobhost/), which runs without this package: derived from
            # spec.work_dir, so a reader of the package never needs it.
            "paths": self.layout.host_paths(),
        }


def build(
    spec: ChainSpec,
    *,
    created: str,
    user: str,
    image: dict[str, Any] | None = None,
    previous_wandb_run_id: str = "",
    checkpoint_start: int | None = None,
) -> Manifest:
    """The run manifest of a checked spec, complete: the shape, the mode's policy, the
    workload's argv and the chain's W&B run are decided here, once. A chain resubmitted
    into a work dir whose run.json names a W&B run continues that run."""
    layout = Layout(Path(spec.work_dir))
    shape = derive(spec)
    policy = mode_policy.decide(spec, tracker=layout.tracker, static_tracker=layout.static_tracker)
    return Manifest(
        spec=spec,
        shape=shape,
        policy=policy,
        image=image,
        created=created,
        user=user,
        workload=tuple(program_argv(spec, shape, policy, layout)),
        wandb_run_id=wandb_run_id(spec, created, previous_wandb_run_id),
        checkpoint_start=checkpoint_start,
    )


def parse(data: Any) -> Manifest:
    """Validate a decoded run.json. Raises ManifestError with one readable line."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ManifestError("not an nvrx-appliance run manifest (schema field missing or wrong)")
    if data.get("version") != VERSION:
        raise ManifestError(
            f"run manifest version {data.get('version')!r} is not supported (this tool reads "
            f"version {VERSION}); resubmit with nvrx-appliance {__version__}"
        )
    if data.get("protocol") != ENTRYPOINT_PROTOCOL:
        raise ManifestError(
            f"run manifest speaks entrypoint protocol {data.get('protocol')!r}, this entrypoint "
            f"speaks {ENTRYPOINT_PROTOCOL}; use an image built with the same nvrx-appliance version"
        )
    try:
        spec = from_dict(data["spec"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"run manifest spec is malformed: {exc}") from None
    problems = check(spec)
    if problems:
        raise ManifestError(f"run manifest is inconsistent: {problems[0]}")
    shape = derive(spec)
    if data.get("shape") != asdict(shape):
        raise ManifestError(
            "run manifest shape does not match its spec (edited by hand?); resubmit"
        )
    if not spec.work_dir:
        raise ManifestError("run manifest has no work_dir")
    try:
        policy = mode_policy.from_dict(data.get("policy"))
    except ValueError as exc:
        raise ManifestError(f"run manifest {exc}; resubmit") from None
    workload = data.get("workload")
    if not isinstance(workload, list) or not all(isinstance(w, str) for w in workload):
        raise ManifestError("run manifest workload is not a list of arguments; resubmit")
    wandb = data.get("wandb")
    run_id = wandb.get("run_id") if isinstance(wandb, dict) else None
    if wandb is not None and not (isinstance(run_id, str) and WANDB_RUN_ID.fullmatch(run_id)):
        raise ManifestError('run manifest wandb is not {"run_id": ID}; resubmit')
    start = data.get("checkpoint_start")
    if start is not None and (isinstance(start, bool) or not isinstance(start, int) or start < 0):
        raise ManifestError("run manifest checkpoint_start is not an iteration; resubmit")
    return Manifest(
        spec=spec,
        shape=shape,
        policy=policy,
        image=data.get("image"),
        created=str(data.get("created", "")),
        user=str(data.get("user", "")),
        tool_version=str(data.get("tool_version", "")),
        protocol=data["protocol"],
        workload=tuple(workload),
        wandb_run_id=run_id or "",
        checkpoint_start=start,
    )


def trust_problem(path: Path, uid: int) -> str | None:
    """Why run.json at `path` must not be obeyed, or None: it names the code every node
    runs (megatron_path, python), so only its owner may be able to change it, or replace
    it through its directory. (The teardown carries its own copy: it runs without
    this package.)"""
    try:
        seen = [("", os.lstat(path)), (" its directory", os.stat(path.parent))]
    except OSError:
        return None  # missing or unreadable: load() says so in its own words
    if not stat.S_ISREG(seen[0][1].st_mode):
        return f"{path} is not a regular file"
    for what, st in seen:
        if st.st_uid != uid:
            return f"{path}{what} is owned by uid {st.st_uid}, not by this job's user (uid {uid})"
        if st.st_mode & 0o022:
            return (
                f"{path}{what} is writable by group or others (mode {st.st_mode & 0o777:04o}); "
                "chmod go-w it and resubmit"
            )
    return None


# A run.json is a few kilobytes; one larger than this is not one, and reading it whole
# would cost a reader (a cron watcher, every node's entrypoint) its memory.
MAX_MANIFEST_BYTES = 4 << 20


def load(path: Path) -> Manifest:
    try:
        text = read_text(path, MAX_MANIFEST_BYTES)
    except OSError as exc:
        raise ManifestError(f"run manifest {path} is unreadable: {exc.strerror}") from None
    if text is None:
        raise ManifestError(f"run manifest {path} does not exist")
    try:
        data = json.loads(text, parse_int=_json_int)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"run manifest {path} is not valid JSON: {exc}") from None
    return parse(data)


def _json_int(text: str) -> int:
    """An integer of run.json. Python refuses to read one of more than 4,300 digits; it
    is read as one of as many digits, so that the check names its setting and refuses it."""
    digits = len(text.lstrip("-"))
    if digits <= declared.READABLE_DIGITS:
        return int(text)
    return (-1 if text.startswith("-") else 1) * declared.too_long_integer(digits)


def save(manifest: Manifest) -> Path:
    path = manifest.layout.run_json
    # allow_nan=False: a bare NaN is not JSON, and check() refuses one before this anyway.
    text = json.dumps(manifest.to_json(), indent=2, sort_keys=True, allow_nan=False)
    write_atomic(path, text + "\n", 0o600)
    return path
