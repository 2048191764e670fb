"""Gathers the Facts that validate.judge needs: the file system, the image, Slurm.

Reads only; nothing here writes, so a refused submission leaves no trace.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nvrx_appliance.checkpoints import checkpoint_dir, tracked_record
from nvrx_appliance.files import read_text
from nvrx_appliance.image import qualification
from nvrx_appliance.image.inspect import ImageError, read_image_manifest
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import slurm_output, slurmcli
from nvrx_appliance.observe.run_files import tracker_value
from nvrx_appliance.observe.types import LIVE_STATES
from nvrx_appliance.settings.chain import ChainSpec, from_dict
from nvrx_appliance.settings.resolve import HOST_PYTHON_RUNTIMES
from nvrx_appliance.settings.validate import Facts, host_checks, is_image_file

MAX_JSON_BYTES = 4 << 20  # run.json, a qualification record: far smaller


def gather(spec: ChainSpec, *, with_slurm: bool, user: str) -> Facts:
    facts = {
        **_unusable(_work_dir, spec.work_dir, "work_dir"),
        **_unusable(_checkpoints, spec.work_dir, "checkpoints"),
        **_unusable(_image, spec.image, "image"),
        **_unusable(_python, spec, "python"),
        "megatron_has_pretrain": _is_file(Path(spec.megatron_path) / "pretrain_gpt.py"),
        "host_paths": {
            path: os.path.exists(path) for check in host_checks(spec) for path in check.required
        },
    }
    existing = _existing_run(spec.work_dir)
    facts["work_dir_wandb_run_id"] = _wandb_run_id(existing)
    facts["work_dir_tracker"] = _tracked(spec.work_dir)
    facts["work_dir_unrecorded"] = _unrecorded(spec.work_dir, facts["work_dir_tracker"])
    if with_slurm:
        facts.update(_slurm(spec.job_name, _job_name(existing), user))
    facts.update(_completed(spec.work_dir, existing))
    return Facts(**facts)


def _unusable(facts: Callable[[Any], dict], value: Any, name: str) -> dict:
    """What `facts` finds, or for a path the system cannot even look up (a component
    longer than the file system allows, a loop of symlinks) the one line naming it."""
    try:
        return facts(value)
    except OSError as exc:
        path = exc.filename or value
        return {f"{name}_error": f"{path} cannot be looked up ({exc.strerror})"}


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False


def _work_dir(work_dir: str) -> dict:
    path = Path(work_dir)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    real = os.path.realpath(path) if path.exists() else os.path.realpath(existing)
    if path.exists() and not path.is_dir():
        return {
            "work_dir_real": real,
            "work_dir_error": f"{work_dir} exists and is not a directory",
        }
    if path.is_dir():
        st = path.stat()
        if st.st_uid != os.geteuid():
            return {
                "work_dir_real": real,
                "work_dir_error": f"{work_dir} belongs to uid {st.st_uid}, not to you",
            }
        if st.st_mode & 0o022:
            # Whoever can write there can replace run.json, which names the code every node runs.
            return {
                "work_dir_real": real,
                "work_dir_error": f"{work_dir} is writable by group or others (mode "
                f"{st.st_mode & 0o777:04o}); `chmod go-w` it",
            }
    # access(2) also says no on a read-only file system, even to root.
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == path else f"cannot be created under {existing}"
        return {"work_dir_real": real, "work_dir_error": f"{work_dir} {what}"}
    return {"work_dir_real": real}


def _checkpoints(work_dir: str) -> dict:
    """What every generation would say of <work>/checkpoints, said before anything is queued."""
    return {
        "checkpoints_error": checkpoint_dir.problem_at(
            Layout(Path(work_dir)).checkpoints, os.geteuid()
        )
    }


def _image(image: str) -> dict:
    if not image or not is_image_file(image):
        return {}
    path = Path(image)
    if not path.is_file():
        return {
            "image_error": f"{image} does not exist; build it with `make image` or fix the path"
        }
    if not os.access(path, os.R_OK):
        return {"image_error": f"{image} is not readable; fix its permissions"}
    return _image_manifest(path)


def _image_manifest(path: Path) -> dict:
    try:
        manifest = read_image_manifest(path)
    except ImageError as exc:
        return {"image_error": str(exc)}
    return {"image_manifest": manifest, "image_qualification": _record(path)}


def _record(image: Path) -> object:
    """The qualification record next to the image; None when absent or unreadable, which
    submit reports the same way: nothing vouches for the image."""
    return _json_file(qualification.record_path(image))


def _json_file(path: Path) -> Any:
    """A small JSON file read bounded and without blocking; None when absent or bad."""
    try:
        return json.loads(read_text(path, MAX_JSON_BYTES) or "null")
    except (OSError, ValueError):
        return None


def _python(spec: ChainSpec) -> dict:
    if spec.runtime not in HOST_PYTHON_RUNTIMES:
        return {}
    python = Path(spec.python)
    if not (python.is_file() and os.access(python, os.X_OK)):
        return {
            "python_error": f"{spec.python} is not an executable Python; pass a venv's bin/python"
        }
    if spec.runtime == "bare" and not (python.parent / "nvrx-entrypoint").is_file():
        return {
            "python_error": f"{python.parent} has no nvrx-entrypoint; point --python at the venv "
            "where nvrx-appliance is installed (the same path on every node)"
        }
    return {}


def _existing_run(work_dir: str) -> dict:
    """The run.json already in the work dir, as decoded ({} if none or unreadable)."""
    data = _json_file(Layout(Path(work_dir)).run_json)
    return data if isinstance(data, dict) else {}


def _job_name(run: dict) -> str:
    try:
        return str(run["spec"]["job_name"])
    except (KeyError, TypeError):
        return ""


def _wandb_run_id(run: dict) -> str:
    wandb = run.get("wandb")
    return str(wandb.get("run_id") or "") if isinstance(wandb, dict) else ""


def _tracked(work_dir: str) -> int | None:
    try:
        return tracker_value(read_text(Layout(Path(work_dir)).tracker, 64) or "")
    except OSError:
        return None


def _unrecorded(work_dir: str, tracked: int | None) -> tuple[int, ...]:
    """The checkpoints before the tracked one, when the tracked record names none of them
    complete; () when it names one (a fall-back has a target) or there is none."""
    checkpoints = Layout(Path(work_dir)).checkpoints
    try:
        names = os.listdir(checkpoints)
        complete = tracked_record.read(checkpoints / tracked_record.FILE)
    except OSError:
        return ()
    if tracked is None:
        return ()
    below = {n for name in names if (n := checkpoint_dir.checkpoint_name(name)) is not None}
    below = {n for n in below if n < tracked}
    return () if below & complete else tuple(sorted(below))


def _completed(work_dir: str, run: dict) -> dict:
    """The final iteration of a chain that completed training in this work dir (its
    training-done marker), and that chain's settings (from its run.json)."""
    try:
        done = tracker_value(read_text(Layout(Path(work_dir)).training_done, 64) or "")
    except OSError:
        return {}
    if done is None:
        return {}
    try:
        old = from_dict(run["spec"])
    except (KeyError, TypeError, ValueError):
        old = None
    return {"work_dir_completed": done, "work_dir_spec": old}


def _slurm(job_name: str, existing_chain: str, user: str) -> dict:
    try:
        config = slurmcli.show_config()
        conflicts = chain_conflicts(job_name, existing_chain, user)
    except (slurmcli.SlurmUnavailable, slurm_output.ParseError) as exc:
        return {"slurm_error": str(exc)}
    return {
        "max_array_size": slurm_output.max_array_size(config),
        "cluster_name": str(config.get("ClusterName", "")),
        **conflicts,
    }


def chain_conflicts(job_name: str, existing_chain: str, user: str) -> dict:
    """The live jobs a new chain would collide with (its name; the chain whose run.json
    is in the work dir), from one squeue of this user's jobs: the controller is shared.
    Raises SlurmUnavailable or ParseError."""
    rows = slurmcli.squeue(user=user)

    def live(name: str) -> tuple[str, ...]:
        # A name still held by a live job would have its generations cancelled by ours.
        ids = {r.array_job_id for r in rows if r.name == name and r.state in LIVE_STATES}
        return tuple(sorted(ids, key=int))

    return {
        "name_in_use": live(job_name),
        "work_dir_chain": existing_chain,
        "work_dir_chain_live": live(existing_chain) if existing_chain else (),
    }


def recheck(spec: ChainSpec, user: str) -> Facts:
    """Submit's Slurm facts again, read under the submit lock just before queueing."""
    try:
        found = chain_conflicts(spec.job_name, _job_name(_existing_run(spec.work_dir)), user)
    except (slurmcli.SlurmUnavailable, slurm_output.ParseError) as exc:
        return Facts(slurm_error=str(exc))
    return Facts(**found)
