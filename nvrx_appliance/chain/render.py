"""The sbatch of one generation, and the sbatch command line, from the run manifest.

Pure: one function renders the script from the manifest and the template (read by the
caller), another lists the sbatch arguments. The script names task 0's teardown, a file
submit writes beside run.json; it does not carry it. Nothing here re-derives a shape: it is all in manifest.shape.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from nvrx_appliance import exitcodes
from nvrx_appliance.manifest import Manifest
from nvrx_appliance.settings import generation_end
from nvrx_appliance.settings.chain import effective_mounts

# The variables the sbatch sets for the entrypoint; pyxis only passes named ones through.
FORWARDED_ENV = (
    "NVRX_ARRAY_THROTTLE",
    "NVRX_ARRAY_SUBMITTED",
    "NVRX_RUN_MANIFEST",
    "NVRX_TERM_DRAIN",
)
ENTRYPOINT = "nvrx-entrypoint"
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
_DIRECTIVE_PLAIN = re.compile(r"[A-Za-z0-9_./:=,%@+-]+")


@dataclass(frozen=True)
class Var:
    """A srun argument that the batch script expands at run time (e.g. the array id)."""

    text: str  # bash double-quoted content, e.g. nvrx_${ARRAY_JOB_ID}_${TASK_ID}


def uses_gpus(manifest: Manifest) -> bool:
    # The cpu workload's "GPUs per node" are worker processes; asking Slurm for GPUs
    # would only make it unschedulable on a cluster without GPU GRES.
    return manifest.spec.workload != "cpu"


def log_pattern(manifest: Manifest) -> str:
    return str(manifest.layout.batch_log_pattern)


def sbatch_args(manifest: Manifest, extra: tuple[str, ...] = ()) -> list[str]:
    """Everything sbatch needs besides the script; `extra` (after `--`) comes last and wins."""
    spec, shape = manifest.spec, manifest.shape
    args = [
        f"--job-name={spec.job_name}",
        f"--array={shape.array_spec}",
        # One generation at a time: the next starts only when every task of this one ended.
        "--dependency=singleton",
        # Task 0 must never come back under its old index: that is what makes the closed
        # flag final for everyone still waiting on it.
        "--no-requeue",
        "--exclusive",
        f"--nodes={spec.nodes_per_task}",
        "--ntasks-per-node=1",
        f"--time={spec.time_limit}",
        # Every generation saves and ends before its limit (settings/generation_end.py).
        *filter(None, [generation_end.sbatch_signal(spec)]),
        f"--chdir={spec.work_dir}",
        f"--output={log_pattern(manifest)}",
    ]
    if uses_gpus(manifest):
        args.append(f"--gpus-per-node={spec.gpus_per_node}")
    if spec.partition:
        args.append(f"--partition={spec.partition}")
    if spec.mem:
        args.append(f"--mem={spec.mem}")
    return args + list(extra)


def host_python(manifest: Manifest) -> str:
    """The Python that runs the teardown on task 0's host: the spec's where the host has
    it (bare, stand-in), else the system's python3 (the package need not be there)."""
    return manifest.spec.python or "python3"


def launch_argv(manifest: Manifest) -> list[str | Var]:
    """srun ... nvrx-entrypoint, for the spec's runtime."""
    spec = manifest.spec
    run_json = str(manifest.layout.run_json)
    mounts = effective_mounts(manifest.spec)
    srun: list[str | Var] = [
        "srun",
        "--label",
        Var("--ntasks=${SLURM_JOB_NUM_NODES:-1}"),
        "--ntasks-per-node=1",
    ]
    if uses_gpus(manifest):
        srun.append(f"--gpus-per-node={spec.gpus_per_node}")
    entry = [ENTRYPOINT, "--manifest", run_json]
    if spec.runtime == "pyxis":
        srun += [
            f"--container-image={spec.image}",
            # A name per task: a cold spare placed on a node that ran another task of this
            # generation must not attach to that task's container.
            Var("--container-name=nvrx_${ARRAY_JOB_ID}_${TASK_ID}"),
            "--no-container-mount-home",
            f"--container-env={','.join(FORWARDED_ENV)}",
        ]
        if mounts:
            srun.append(f"--container-mounts={mounts}")
        return srun + entry
    if spec.runtime == "apptainer":
        runner = ["apptainer", "exec", "--nv", "--no-home"]
        if mounts:
            runner += ["--bind", mounts]
        return srun + runner + [spec.image] + entry
    if spec.runtime == "bwrap-standin":
        runner = [spec.python, "-m", "nvrx_appliance.image.standin", "run", "--image", spec.image]
        if mounts:
            runner += ["--mounts", mounts]
        return srun + runner + ["--"] + entry
    # bare: the console script of the venv that submitted, so ft_launcher is its neighbour.
    return [*srun, os.path.join(os.path.dirname(spec.python), ENTRYPOINT), *entry[1:]]


def launch_env(manifest: Manifest) -> str:
    if manifest.spec.runtime != "bare":
        return ""
    bindir = os.path.dirname(manifest.spec.python)
    # The entrypoint starts ft_launcher by name; bare mode finds it beside the Python.
    return f"export PATH={shlex.quote(bindir)}:$PATH"


def _double_quoted(text: str) -> str:
    return re.sub(r'([\\$`"])', r"\\\1", text)


# Stands for the array job id in a Layout path that the batch script completes at run time.
_ARRAY_JOB_ID = "NVRX-ARRAY-JOB-ID"


def generation_path(path: Path) -> str:
    """A path of the running generation, built with _ARRAY_JOB_ID for its array job id,
    as a bash word that expands ${ARRAY_JOB_ID} at run time."""
    before, after = str(path).split(_ARRAY_JOB_ID)
    return f'"{_double_quoted(before)}${{ARRAY_JOB_ID}}{_double_quoted(after)}"'


# The rendered command's lines: continued with a backslash, each at most this wide.
_LINE_WIDTH = 88


def shell_words(argv: list[str | Var]) -> str:
    words = [f'"{a.text}"' if isinstance(a, Var) else shlex.quote(a) for a in argv]
    return " \\\n    ".join(_fill(_pair_flags(words)))


def _pair_flags(words: list[str]) -> list[str]:
    """Keep a flag and its separate value together on one line of the rendered command."""
    lines: list[str] = []
    for word in words:
        if lines and lines[-1] in ("--bind", "--mounts", "--image", "--manifest", "-m"):
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def _fill(groups: list[str]) -> list[str]:
    """As many groups on a line as fit in _LINE_WIDTH; a longer group alone."""
    lines: list[str] = []
    for group in groups:
        if lines and len(lines[-1]) + 1 + len(group) <= _LINE_WIDTH:
            lines[-1] += " " + group
        else:
            lines.append(group)
    return lines


def directive(arg: str) -> str:
    """One #SBATCH line. sbatch splits these lines at blanks and ends them at a `#`, except
    inside double quotes, where a backslash takes the next character as it is."""
    if _DIRECTIVE_PLAIN.fullmatch(arg):
        return f"#SBATCH {arg}"
    return '#SBATCH "' + re.sub(r'([\\"])', r"\\\1", arg) + '"'


def render(manifest: Manifest, *, template: str, extra: tuple[str, ...] = ()) -> str:
    """The batch script of every generation of this chain."""
    spec, layout = manifest.spec, manifest.layout
    control_files = layout.control_files(_ARRAY_JOB_ID)
    directives = "\n".join(map(directive, sbatch_args(manifest, extra)))
    values = {
        "job_name": spec.job_name,
        "run_json": shlex.quote(str(layout.run_json)),
        "sbatch_directives": directives,
        "tracker": shlex.quote(str(layout.tracker)),
        "control": generation_path(layout.control(_ARRAY_JOB_ID)),
        "closed": generation_path(control_files.closed),
        "fence": generation_path(control_files.fence),
        "relay": generation_path(control_files.relay),
        "no_restart_witness": generation_path(control_files.no_restart),
        "time_limit_notice": generation_path(control_files.time_limit),
        "time_limit_signal": generation_end.SAVE_SIGNAL.name.removeprefix("SIG"),
        "host_python": shlex.quote(host_python(manifest)),
        "teardown": shlex.quote(str(layout.teardown)),
        "host_code": " ".join(shlex.quote(str(path)) for path in layout.host_code),
        "drain_poller": shlex.quote(str(layout.drain_poller)),
        "drain_dir": generation_path(layout.drain(_ARRAY_JOB_ID)),
        "drain_poll_interval": str(spec.drain_poll_interval),
        # Where the chain samples stacks, the poller keeps pending tasks off hung nodes.
        "hangs_dir": generation_path(layout.hangs(_ARRAY_JOB_ID)) if spec.stack_sampling else '""',
        "no_restart": str(exitcodes.NVRX_NO_RESTART),
        "chain_id": shlex.quote(manifest.chain_id),
        "task0_gone": str(exitcodes.TASK0_GONE),
        "active_tasks": str(manifest.shape.active_tasks),
        "launch_env": launch_env(manifest),
        "srun": shell_words(launch_argv(manifest)),
    }
    missing = set(_PLACEHOLDER.findall(template)) - set(values)
    if missing:
        raise KeyError(f"template placeholders without a value: {sorted(missing)}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)
