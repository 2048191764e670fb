"""Everything submit refuses before it writes or submits anything. Pure.

chain.check judges the spec alone. This module adds what needs facts about the world
(the file system, the image, Slurm), which chain/probe.py gathers into a Facts value:
the judging stays pure and every message is testable without a cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from nvrx_appliance import ENTRYPOINT_PROTOCOL
from nvrx_appliance.settings import generation_end
from nvrx_appliance.settings.chain import (
    CONTAINER_RUNTIMES,
    ChainSpec,
    Problem,
    check,
    derive,
    effective_mounts,
    effective_runtime,
    flag,
    is_image_file,
    parse_mounts,
)
from nvrx_appliance.settings.megatron import paths as megatron_paths
from nvrx_appliance.settings.program_argv import CPU_MODULE

# Directories that are private to one node on every cluster we know: the rendezvous
# record is published through the work dir, so each node would see a different one.
NODE_LOCAL = ("/tmp", "/var/tmp", "/dev/shm")
# pyxis/enroot: [USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]; apptainer adds a scheme.
_REGISTRY_REF = re.compile(
    r"^(?:(?:docker|oras|library)://)?"
    r"(?:[A-Za-z0-9._-]+@)?"
    r"(?:[A-Za-z0-9.-]+(?::\d+)?#)?"
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?"
    r"(?:@sha256:[a-f0-9]{64})?$"
)


@dataclass(frozen=True)
class Facts:
    """What probe.py found out. None means "not looked at" (e.g. Slurm skipped in a dry run)."""

    work_dir_real: str = ""  # realpath of the work dir, or of its nearest existing parent
    work_dir_error: str | None = None  # why it cannot be created or written
    # Why every generation would refuse <work>/checkpoints (checkpoint_dir.problem_at).
    checkpoints_error: str | None = None
    image_error: str | None = None  # file missing, unreadable, or not an appliance image
    image_manifest: dict[str, Any] | None = None
    image_qualification: Any = None  # the record next to the image, as decoded, if any
    megatron_has_pretrain: bool | None = None
    python_error: str | None = None  # the host Python the nodes run cannot start the entrypoint
    slurm_error: str | None = None  # Slurm unreachable
    max_array_size: int | None = None
    cluster_name: str = ""  # Slurm's ClusterName ("" when not asked)
    name_in_use: tuple[str, ...] = field(default_factory=tuple)  # job ids holding the name
    # The chain whose run.json is already in the work dir, and its live job ids.
    work_dir_chain: str = ""
    work_dir_chain_live: tuple[str, ...] = field(default_factory=tuple)
    # The W&B run that run.json names, which a resubmitted chain continues.
    work_dir_wandb_run_id: str = ""
    # The iteration the work dir's tracker names now (None: none): where the chain starts.
    work_dir_tracker: int | None = None
    # Checkpoints on disk before the tracked one, when the tracked record names none of
    # them complete (a work dir from before the record): no fall-back can reach them.
    work_dir_unrecorded: tuple[int, ...] = ()
    # Host paths the user's workload arguments need (host_checks), and whether each exists.
    host_paths: dict[str, bool] = field(default_factory=dict)
    # The chain already in the work dir, when it completed training: the final iteration
    # its training-done marker names, and its settings (None if run.json is unreadable).
    work_dir_completed: int | None = None
    work_dir_spec: ChainSpec | None = None


def is_registry_ref(image: str) -> bool:
    return bool(_REGISTRY_REF.match(image))


def node_local(path: str) -> bool:
    return any(path == root or path.startswith(root + "/") for root in NODE_LOCAL)


def judge(spec: ChainSpec, facts: Facts, *, force: bool = False) -> list[Problem]:
    """Every problem at once, so one round of fixes is enough."""
    problems = check(spec)
    shape_ok = not problems  # the pool-size arithmetic needs sane numbers
    problems += _work_dir(spec, facts)
    problems += _image(spec, facts)
    problems += _host_side(spec, facts)
    problems += _workload_paths(spec, facts)
    problems += cluster_problems(spec, facts, force=force, shape_ok=shape_ok)
    problems += generation_end.problems(spec)
    problems += _completed(spec, facts, force=force)
    return problems


def unrecorded_warning(spec: ChainSpec, facts: Facts) -> str | None:
    """A work dir whose earlier checkpoints the tracked record never named: its first
    fall-back finds no target and stops the chain (checkpoints/fallback.py). Said at
    submit, with the fix, while it is cheap."""
    if not facts.work_dir_unrecorded or spec.checkpoint_fallbacks == 0:
        return None
    shown = ", ".join(map(str, facts.work_dir_unrecorded[-3:]))
    newest = facts.work_dir_unrecorded[-1]
    return (
        f"{spec.work_dir}/checkpoints holds checkpoints before the tracked "
        f"{facts.work_dir_tracker} ({shown}) that checkpoints/tracked.jsonl never named "
        "complete (a work dir from before the record, or saves cut short, look alike): if "
        "the tracked checkpoint fails to load, the chain stops instead of falling back. If "
        f'you know one is complete, add a line {{"tracked": {newest}}} to '
        "checkpoints/tracked.jsonl before you submit"
    )


def _completed(spec: ChainSpec, facts: Facts, *, force: bool) -> list[Problem]:
    """A chain queued where training is already done would load the final checkpoint,
    find nothing to train, and stop: refused unless it trains longer, or --force."""
    if facts.work_dir_completed is None or force:
        return []
    why = generation_end.resubmit_problem(facts.work_dir_spec, spec, facts.work_dir_completed)
    return [Problem(flag("work_dir"), why)] if why else []


def _work_dir(spec: ChainSpec, facts: Facts) -> list[Problem]:
    option = flag("work_dir")
    if facts.work_dir_real and node_local(facts.work_dir_real):
        return [
            Problem(
                option,
                f"{spec.work_dir} is node-local ({facts.work_dir_real}); the rendezvous record is "
                "published through it, so use a shared file system visible at the same path on every node",
            )
        ]
    if facts.work_dir_error:
        return [Problem(option, f"{facts.work_dir_error}; pick a directory you can write")]
    if facts.checkpoints_error:
        return [Problem(option, facts.checkpoints_error)]
    return []


def _image(spec: ChainSpec, facts: Facts) -> list[Problem]:
    option = flag("image")
    if not spec.image:
        return []
    if not is_image_file(spec.image):
        if spec.runtime == "bwrap-standin":
            return [Problem(option, "the bwrap stand-in runs a local .sqsh file; pass its path")]
        if not is_registry_ref(spec.image):
            return [
                Problem(
                    option,
                    f"{spec.image!r} is neither an image file nor a registry reference; "
                    "pass a .sqsh/.sif path or e.g. registry.example#nvidia/pytorch:25.01-py3",
                )
            ]
        return []
    if facts.image_error:
        return [Problem(option, facts.image_error)]
    manifest = facts.image_manifest
    if manifest is None:
        return []
    if manifest.get("entrypoint_protocol") != ENTRYPOINT_PROTOCOL:
        return [
            Problem(
                option,
                f"the image's entrypoint speaks protocol {manifest.get('entrypoint_protocol')!r}, "
                f"this nvrx-appliance speaks {ENTRYPOINT_PROTOCOL}; rebuild it with `make image`",
            )
        ]
    held = (manifest.get("probed") or {}).get("trainer_module")
    if spec.workload == "cpu" and held != CPU_MODULE:
        return [
            Problem(
                option,
                f"--workload cpu runs {CPU_MODULE}, which the image does not hold (it holds "
                f"{held or 'no recorded trainer'}; built by nvrx-appliance "
                f"{manifest.get('appliance_version', 'unknown')}); rebuild it with `make image`",
            )
        ]
    if manifest.get("flavor") == "cpu" and spec.workload == "megatron":
        return [
            Problem(
                flag("workload"),
                "the image is a cpu build without Megatron-LM; pass --workload cpu or a gpu image",
            )
        ]
    return _megatron_in_image(spec, manifest)


def _megatron_in_image(spec: ChainSpec, manifest: dict[str, Any]) -> list[Problem]:
    """--megatron-path against where the image holds Megatron-LM: every rank would run
    pretrain_gpt.py from a directory the image does not have. A checkout the user mounts
    in at another path is theirs to vouch for (the mount's host side is checked)."""
    pins = manifest.get("pins")
    held = pins.get("megatron_path") if isinstance(pins, dict) else None
    if spec.workload != "megatron" or not isinstance(held, str) or not held.startswith("/"):
        return []  # an image that records no checkout: nothing to compare
    path = spec.megatron_path.rstrip("/") or "/"
    if path == held.rstrip("/") or any(_under(path, dst) for _, dst in mount_pairs(spec)):
        return []
    return [
        Problem(
            flag("megatron_path"),
            f"{spec.megatron_path} is not where the image holds Megatron-LM ({held}) nor "
            f"under a container mount; pass --megatron-path {held}, or mount your own "
            "checkout there with --mounts",
        )
    ]


def _host_side(spec: ChainSpec, facts: Facts) -> list[Problem]:
    problems = []
    if facts.python_error:
        problems.append(Problem(flag("python"), facts.python_error))
    if (
        spec.runtime == "bare"
        and spec.workload == "megatron"
        and facts.megatron_has_pretrain is False
    ):
        problems.append(
            Problem(
                flag("megatron_path"),
                f"{spec.megatron_path} has no pretrain_gpt.py; point it at a Megatron-LM checkout "
                "present on every node (or use --workload cpu)",
            )
        )
    return problems


def cluster_problems(
    spec: ChainSpec, facts: Facts, *, force: bool, shape_ok: bool = True
) -> list[Problem]:
    """What Slurm says against this chain: unreachable, MaxArraySize, a live chain that
    holds its name or its work dir."""
    if facts.slurm_error:
        return [
            Problem(
                "slurm",
                f"unreachable ({facts.slurm_error}); check that slurmctld is up and SLURM_CONF "
                "points at it, or review the plan anywhere with --dry-run",
            )
        ]
    problems = []
    size = derive(spec).array_size
    if shape_ok and facts.max_array_size is not None and size > facts.max_array_size:
        problems.append(
            Problem(
                flag("cold_spares"),
                f"a pool of {size} tasks exceeds the cluster's MaxArraySize={facts.max_array_size}; "
                f"lower --cold-spares to at most {max(facts.max_array_size - derive(spec).active_tasks, 0)}, "
                "or queue more generations (--depth) instead of a deeper pool",
            )
        )
    if facts.work_dir_chain_live and facts.work_dir_chain != spec.job_name and not force:
        problems.append(
            Problem(
                flag("work_dir"),
                f"{spec.work_dir} holds the run manifest of your live chain "
                f"{facts.work_dir_chain!r} (job(s) {', '.join(facts.work_dir_chain_live)}), which "
                "every one of its generations reads: pick another --work-dir, or first "
                f"`nvrx-appliance cancel {facts.work_dir_chain}`",
            )
        )
    if facts.name_in_use and not force:
        problems.append(
            Problem(
                flag("job_name"),
                f"{spec.job_name!r} is used by your queued or running job(s) "
                f"{', '.join(facts.name_in_use)}; chains sharing a name cancel each other's "
                "generations: pick another --job-name (or --force if that chain is this one)",
            )
        )
    return problems


def mount_pairs(spec: ChainSpec) -> list[tuple[str, str]]:
    """(host source, container destination) of every container mount (none if malformed:
    chain.check refuses those)."""
    try:
        return [(src, dst) for src, dst, _ in parse_mounts(effective_mounts(spec))]
    except ValueError:
        return []


def _under(path: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root if root == "/" else root + "/")


def on_host(path: str, spec: ChainSpec) -> str | None:
    """Where the host sees a path the workload names; None: no mount brings it in."""
    if effective_runtime(spec) not in CONTAINER_RUNTIMES:
        return path
    covering = [(src, dst) for src, dst in mount_pairs(spec) if _under(path, dst)]
    if not covering:
        return None
    src, dst = max(covering, key=lambda pair: len(pair[1]))  # the innermost mount wins
    return src.rstrip("/") + path[len(dst.rstrip("/")) :]


@dataclass(frozen=True)
class HostCheck:
    """One path of the user's workload arguments, and what the host must show for it."""

    option: str  # --megatron-args or --script
    what: str  # e.g. "--data-path /data/corpus"
    path: str  # as the workload sees it
    host: str | None  # as the host sees it; None: not under any container mount
    required: tuple[str, ...]  # host paths that must exist
    must_be_mounted: bool  # True: outside the mounts it is refused, not assumed in the image


def host_checks(spec: ChainSpec) -> list[HostCheck]:
    """Every host-visible path the user's arguments name (pure; probe.py stats them)."""
    checks = []
    if spec.workload == "megatron":
        for arg in megatron_paths.path_args(spec.megatron_args):
            if not arg.path.startswith("/"):
                continue  # chain.check refuses relative paths
            host = on_host(arg.path, spec)
            required = tuple(on_host(p, spec) or p for p in megatron_paths.required_files(arg))
            checks.append(
                HostCheck(flag("megatron_args"), f"{arg.flag} {arg.path}", arg.path, host,
                          required if host else (), must_be_mounted=True)
            )  # fmt: skip
    if spec.workload == "script" and spec.script.startswith("/"):
        host = on_host(spec.script, spec)
        # Outside every mount a script may live in the image itself: not refused.
        checks.append(
            HostCheck(flag("script"), "your script", spec.script, host,
                      (host,) if host else (), must_be_mounted=False)
        )  # fmt: skip
    return checks


def _suggest_mount(spec: ChainSpec, path: str) -> str:
    directory = path.rsplit("/", 1)[0] or "/"
    return ",".join(filter(None, [effective_mounts(spec), f"{directory}:{directory}"]))


def _workload_paths(spec: ChainSpec, facts: Facts) -> list[Problem]:
    problems = []
    for item in host_checks(spec):
        if item.host is None:
            if item.must_be_mounted:
                problems.append(
                    Problem(
                        item.option,
                        f"{item.what} is not under any container mount, so the job cannot "
                        f"see it; add its directory: --mounts {_suggest_mount(spec, item.path)}",
                    )
                )
            continue
        missing = [p for p in item.required if facts.host_paths.get(p) is False]
        if missing:
            where = "" if item.host == item.path else f" (on this host: {item.host})"
            problems.append(
                Problem(
                    item.option,
                    f"{item.what}: {', '.join(missing)} does not exist{where}; fix the path "
                    "(every node must see it at the same path)",
                )
            )
    return problems
