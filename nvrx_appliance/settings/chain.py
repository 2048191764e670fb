"""ChainSpec: every setting of one chain, and everything that derives from it.

This module is the single list of what a chain can be configured with. `submit`
resolves a ChainSpec once (flags > environment > config file > defaults), validates it,
and writes it with its derived Shape into run.json; the entrypoint, `status` and the
watcher read them from there and never re-derive the shape from the environment.

Pure: no I/O, no Slurm, no clock.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from nvrx_appliance import lease
from nvrx_appliance.settings import declared, exit_actions
from nvrx_appliance.settings.megatron import parallel
from nvrx_appliance.settings.megatron import rules as megatron_rules

# bwrap-standin is a test stand-in for pyxis + enroot, which cannot exist on a machine
# without GPUs: it unpacks the same .sqsh and starts it with bubblewrap (docs/images.md).
RUNTIMES = ("pyxis", "apptainer", "bare", "bwrap-standin")
CONTAINER_RUNTIMES = ("pyxis", "apptainer", "bwrap-standin")
STRAGGLER_ACTIONS = ("report", "replace")
# train is the default: a real run. The two demo modes switch the fault injectors on.
MODES = ("train", "no-restart", "handoff")
DEMO_MODES = ("no-restart", "handoff")
WORKLOADS = ("megatron", "cpu", "script")
# small and 8b are demo presets on mock data; none passes only the user's arguments.
PROFILES = ("small", "8b", "none")
FAULT_TYPES = ("exception", "exit", "hang")
# A pause longer than this would trip the out-of-section timeout of a quick chain.
MAX_CPU_STEP_PAUSE_S = 10.0
# Liveness beats come once a second (node/liveness_rule.py): a shorter silence timeout than
# three of them would take a datagram or two lost for a death.
MIN_SILENCE_S = 3


def _opt(
    default: Any,
    help: str,
    env: str | None = None,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    unit: str = "",
    choices: tuple[str, ...] | None = None,
    pattern: tuple[re.Pattern[str], str] | None = None,
    hint: str = "",
    **extra: Any,
) -> Any:
    """A ChainSpec field with its CLI help, the reference deployment's NVRX_* environment
    name, and what a value of it alone may be (field_problem() judges it): numeric bounds
    (with the unit the message names), a set of choices, or a pattern with what to write
    instead; `hint` follows the message. An empty default makes empty a valid choice or
    pattern (unset: the default decides)."""
    meta = {
        "help": help,
        "env": env,
        "minimum": minimum,
        "maximum": maximum,
        "unit": unit,
        "choices": choices,
        "pattern": pattern,
        "hint": hint,
        **extra,
    }
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


# Used with fullmatch: `$` would let a trailing newline through. ASCII digits only:
# str.isdigit and \d accept "²", which int() then refuses with a traceback.
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_TIME = re.compile(r"([0-9]+-)?[0-9]{1,2}(:[0-9]{2}){0,2}|[0-9]+")
# Empty is a valid size: sbatch is then given no --mem and the cluster's default applies.
_MEM = re.compile(r"([0-9]+[KMGT]?)?")
_GPU_FAILURE = re.compile(r"[0-9]+:[0-9]+(,[0-9]+:[0-9]+)*")
_COUNT = re.compile(r"[0-9]+")
SECONDS = "seconds"
# Where a path setting is read (its `path` metadata). A host path is one submit sees at the
# same place as every node (the work dir, the bare Python, an image file): a relative one
# or one under ~ is made absolute at submit. A node path is read where the job runs:
# inside the image under a container runtime, where only an absolute path means one place
# (on bare metal it is a host path). A socket path is each node's own, always absolute.
HOST_PATH, NODE_PATH, SOCKET_PATH = "host", "node", "socket"


@dataclass(frozen=True)
class ChainSpec:
    # --- shape -----------------------------------------------------------------------
    train_tasks: int = _opt(
        2,
        "Array tasks that train (the minimum world).",
        "NVRX_TRAIN_TASKS",
        minimum=1,
        hint="set --train-tasks 1 or more",
    )
    hot_spares: int = _opt(
        1,
        "Tasks admitted with the active set and kept warm by NVRx.",
        "NVRX_HOT_SPARES",
        minimum=0,
        hint="use 0 for none",
    )
    cold_spares: int = _opt(
        0,
        "Tasks left pending behind the array throttle; admitted as others end.",
        "NVRX_COLD_SPARES",
        minimum=0,
        hint="use 0 for none",
    )
    nodes_per_task: int = _opt(1, "Nodes per array task.", "NVRX_NODES_PER_TASK", minimum=1)
    gpus_per_node: int = _opt(
        8, "GPUs (and so worker processes) per node.", "NVRX_GPUS_PER_NODE", minimum=1
    )
    depth: int = _opt(3, "Generations queued in the chain (K).", "NVRX_CHAIN_DEPTH", minimum=1)
    job_name: str = _opt(
        "nvrx-chain",
        "Slurm job name shared by every generation.",
        "NVRX_JOB_NAME",
        pattern=(_JOB_NAME, "is not a usable Slurm job name; use letters, digits, '.', '_', '-'"),
    )
    time_limit: str = _opt(
        "01:00:00",
        "Wall time of one generation.",
        "NVRX_TIME_LIMIT",
        flag="--time",
        pattern=(_TIME, "is not a Slurm time; use e.g. 01:00:00 or 1-00:00:00"),
    )
    time_limit_margin: str = _opt(
        "auto",
        "Seconds before --time at which each generation saves and ends: auto (the "
        "checkpointing timeout, at most a quarter of --time), off (run into Slurm's "
        "limit), or a number.",
        "NVRX_TIME_LIMIT_MARGIN",
    )
    partition: str = _opt("", "Slurm partition (empty: the cluster default).", "NVRX_PARTITION")
    # The reference asks for the whole node: under DefMemPerCPU a task would otherwise
    # get a small default limit, and the out-of-memory killer ends a healthy rank.
    mem: str = _opt(
        "0",
        "sbatch --mem per node (0: all of it; empty: the cluster default).",
        "NVRX_MEM",
        pattern=(_MEM, "is not a Slurm memory size; use e.g. 0 (all), 200G or 512000M"),
    )
    # --- where and how it runs ---------------------------------------------------------
    work_dir: str = _opt(
        "", "Shared work directory, same path on every node.", "NVRX_WORK_DIR", path=HOST_PATH
    )
    image: str = _opt(
        "",
        "Appliance image (.sqsh / .sif, or a registry reference); empty runs bare metal.",
        "NVRX_CONTAINER_IMAGE",
        path=HOST_PATH,
    )
    # None: default mounts (the work dir); "": explicitly none, as in the reference deployment.
    mounts: str | None = _opt(
        None,
        "Container mounts SRC:DST[,..]; unset mounts the work dir, empty mounts nothing.",
        "NVRX_CONTAINER_MOUNTS",
    )
    runtime: str = _opt(
        "",
        "pyxis, apptainer or bare (default: pyxis with an image, else bare).",
        "NVRX_RUNTIME",
        choices=RUNTIMES,
    )
    python: str = _opt(
        "",
        "Bare mode: the Python that runs nvrx-entrypoint on the nodes (default: this one).",
        "NVRX_PYTHON",
        path=HOST_PATH,
    )
    megatron_path: str = _opt(
        "/workspace/megatron-lm",
        "Megatron-LM checkout (inside the image, or on every node).",
        "MEGATRON_PATH",
        path=NODE_PATH,
    )
    # --- what it runs ------------------------------------------------------------------
    mode: str = _opt(
        "train",
        "train (no injected faults), or a demo: no-restart or handoff (they inject faults).",
        "NVRX_MODE",
        choices=MODES,
    )
    workload: str = _opt(
        "megatron",
        "megatron (pretrain_gpt.py), script (your own PyTorch script), or cpu (built-in trainer).",
        "NVRX_WORKLOAD",
        choices=WORKLOADS,
    )
    profile: str = _opt(
        "",
        "Megatron preset: small or 8b (demo models on mock data), or none (only your "
        "--megatron-args). Empty: none when --megatron-args is given, else small.",
        "NVRX_MODEL_PROFILE",
        choices=PROFILES,
    )
    # _opt gives list settings a default_factory, which RUF009 cannot see.
    megatron_args: list[str] = _opt(  # noqa: RUF009
        [],
        "File of your pretrain_gpt.py arguments, one argument or '--flag value' per line, "
        "# comments; they follow the preset's, so they override it.",
        "NVRX_MEGATRON_ARGS",
    )
    script: str = _opt(
        "",
        "--workload script: your training script's path (inside the image, or on every node).",
        "NVRX_SCRIPT",
        path=NODE_PATH,
    )
    script_args: list[str] = _opt(  # noqa: RUF009
        [],
        "File of your script's arguments, in the --megatron-args file format.",
        "NVRX_SCRIPT_ARGS",
    )
    # The shape's sizes: 0 takes what your --megatron-args say (settings/megatron/parallel.py),
    # else the default; a setting and a line of your arguments that disagree are refused.
    micro_batch: int = _opt(
        0,
        "Micro batch size per rank (0: your --micro-batch-size, else 1).",
        "NVRX_MICRO_BATCH",
        minimum=0,
    )
    global_batch: int = _opt(
        0,
        "Global batch size (0: your --global-batch-size, else micro batch x data-parallel size).",
        "NVRX_GLOBAL_BATCH",
        minimum=0,
    )
    tensor_parallel: int = _opt(
        0,
        "Tensor-parallel size (0: your --tensor-model-parallel-size, else 1).",
        "NVRX_TP",
        minimum=0,
    )
    pipeline_parallel: int = _opt(
        0,
        "Pipeline-parallel size (0: your --pipeline-model-parallel-size, else 1).",
        "NVRX_PP",
        minimum=0,
    )
    context_parallel: int = _opt(
        0, "Context-parallel size (0: your --context-parallel-size, else 1).", "NVRX_CP", minimum=0
    )
    expert_parallel: int = _opt(
        0,
        "Expert-parallel size (0: your --expert-model-parallel-size, else 1).",
        "NVRX_EP",
        minimum=0,
    )
    expert_tensor_parallel: int = _opt(
        0,
        "Expert tensor-parallel size (0: your --expert-tensor-parallel-size, else the "
        "tensor-parallel size).",
        "NVRX_ETP",
        minimum=0,
    )
    virtual_pipeline: int = _opt(
        0,
        "Virtual pipeline stages per pipeline rank (0: as your arguments say, else none).",
        "NVRX_VP",
        minimum=0,
    )
    save_interval: int = _opt(
        20, "Iterations between checkpoints.", "NVRX_SAVE_INTERVAL", minimum=1
    )
    # Three: the tracked checkpoint and one for each of the two fall-backs the default
    # --checkpoint-fallbacks promises (exit_actions.retention_warning says when they disagree).
    save_retention: int = _opt(
        3,
        "Newest complete checkpoints kept; older ones are removed, never the tracked one or "
        "one being written (0 keeps all).",
        "NVRX_SAVE_RETENTION",
        minimum=0,
    )
    async_save: bool = _opt(
        True,
        "Megatron: save checkpoints asynchronously through NVRx (torch_dist, --async-save, "
        "a persistent worker); --no-async-save saves synchronously.",
        "NVRX_ASYNC_SAVE",
    )
    train_samples: int = _opt(
        0,
        "Samples to train (0: the mode's default).",
        "NVRX_TRAIN_SAMPLES",
        minimum=0,
        # Megatron reads it as a 64-bit count; more than 2**31 samples is a real run.
        largest=2**62,
    )
    cpu_step_pause: float = _opt(
        0.0,
        "--workload cpu: seconds each training step sleeps (0: none), so that many nodes "
        "of the local cluster share a few cores without contending.",
        "NVRX_CPU_STEP_PAUSE",
        minimum=0.0,
        maximum=MAX_CPU_STEP_PAUSE_S,
        unit=SECONDS,
    )
    exit_duration_min: int = _opt(
        0,
        "Minutes after task 0 starts a generation at which it saves and ends, however "
        "many in-job restarts happened (0: off).",
        "NVRX_EXIT_DURATION",
        minimum=0,
    )
    # --- NVRx ft_launcher ----------------------------------------------------------------
    setup_timeout: int = _opt(
        600, "Section timeout (s): setup.", "NVRX_SETUP_TIMEOUT", minimum=1, unit=SECONDS
    )
    step_timeout: int = _opt(
        180, "Section timeout (s): training step.", "NVRX_STEP_TIMEOUT", minimum=1, unit=SECONDS
    )
    checkpointing_timeout: int = _opt(
        600,
        "Section timeout (s): checkpointing.",
        "NVRX_CHECKPOINTING_TIMEOUT",
        minimum=1,
        unit=SECONDS,
    )
    out_of_section_timeout: int = _opt(
        600,
        "Timeout (s) outside any section (a script that never connects to NVRx's rank "
        "monitor: its guard keeps it, docs/hangs.md).",
        "NVRX_OUT_OF_SECTION_TIMEOUT",
        minimum=1,
        unit=SECONDS,
    )
    max_restarts: int = _opt(8, "In-job restarts per generation.", "NVRX_MAX_RESTARTS", minimum=0)
    max_no_progress_cycles: int = _opt(
        3,
        "Cycles without checkpoint progress before NVRx exits 93 (0: progress tracking "
        "off; the no-restart demo uses 1).",
        "NVRX_MAX_NO_PROGRESS_CYCLES",
        minimum=0,
        hint="0 turns NVRx's progress tracking off",
    )
    join_timeout: int = _opt(
        600, "Rendezvous join timeout (s).", "NVRX_JOIN_TIMEOUT", minimum=1, unit=SECONDS
    )
    store_connect_wait: int = _opt(
        300,
        "Seconds a node keeps dialing the TCP store.",
        "NVRX_STORE_CONNECT_WAIT",
        minimum=1,
        unit=SECONDS,
    )
    rdzv_host_wait: int = _opt(
        300,
        "Seconds a peer waits for task 0's record once task 0 has started.",
        "NVRX_RDZV_HOST_WAIT",
        minimum=1,
        unit=SECONDS,
    )
    rdzv_port: int = _opt(
        29500,
        "Rendezvous (TCP store) port on task 0 (1024 to 65535: the job runs as you).",
        "NVRX_RDZV_PORT",
        # Below 1024 only root may listen, and the job runs as the user.
        minimum=1024,
        maximum=65535,
        hint="ports below 1024 need root, and the job runs as you: pick one of 1024 to 65535",
    )
    lease_stale_after: int = _opt(
        # Rides out a 40 s stall of the shared file system (GPFS's failure detection is
        # 35 s by default) before a live task 0 stops itself; a dead one is replaced about
        # this long after its death instead of Slurm's SlurmdTimeout (300 s by default).
        46,
        "Seconds without a task-0 lease refresh before a peer fences task 0 as dead "
        "(task 0 stops itself earlier: see docs/how-it-works.md, Task 0's lease).",
        "NVRX_LEASE_STALE_AFTER",
        # 0 does not mean "off" here: task 0 would fence itself at its first look and its
        # peers at once, so every generation would die until the burn guard stops the chain.
        minimum=1,
        unit=SECONDS,
        hint="the lease cannot be turned off; leave it at the default 46",
    )
    node_silence_timeout: int = _opt(
        # Ten seconds: twice a 5 s network blip, and a node's entrypoint beats every
        # second from a thread that touches no file system, so only a node that is dead,
        # frozen or cut off stays silent that long (docs/liveness.md, Silent node deaths).
        10,
        "Seconds a node may send task 0 no liveness beat before task 0 takes it as dead: "
        "a hot spare takes its place in an in-job restart, or the generation hands off "
        "(0: off; a silent death then waits for NVRx's section timeouts).",
        "NVRX_NODE_SILENCE_TIMEOUT",
        minimum=0,
        unit=SECONDS,
    )
    lease_watchers: int = _opt(
        # Task 0 and all of them must be lost together before a dead task 0 waits for
        # the backstop; each costs the metadata server four calls a second.
        lease.DEFAULT_WATCHERS,
        "Peers (node 0 of array tasks 1..N) that read task 0's lease twice a second; the "
        "other nodes read it rarely and learn of the generation's end from Slurm.",
        "NVRX_LEASE_WATCHERS",
        minimum=1,
    )
    closed_flag_grace: int = _opt(
        3,
        "Seconds between TERM and KILL when the closed flag stops ft_launcher.",
        "NVRX_CLOSED_GRACE",
        minimum=0,
    )
    segment: str = _opt(
        "auto", "auto, off, or N (minimum nodes per NVLink domain).", "NVRX_SEGMENT"
    )
    health_check_endpoint: str = _opt(
        "",
        "NVRx health-check endpoint: the absolute path of the site's Unix socket on each "
        "node, or unix:///path (empty: none).",
        "NVRX_HEALTH_CHECK_ENDPOINT",
        path=SOCKET_PATH,
    )
    log_debug: bool = _opt(False, "NVRx debug logging.", "NVRX_LOG_DEBUG")
    gpus_per_numa: int = _opt(
        0, "Ranks per NUMA node for numactl binding (0: off).", "NVRX_GPUS_PER_NUMA", minimum=0
    )
    # --- fault injection -----------------------------------------------------------------
    fault_inject: bool = _opt(
        True,
        "Demo modes: inject a workload fault (train mode never injects).",
        "NVRX_FAULT_INJECT",
    )
    fault_ranks: str = _opt(
        "1", "Global ranks a workload fault may hit (comma list).", "NVRX_FAULT_RANKS"
    )
    fault_delay: float = _opt(
        60.0, "Seconds after training starts before the fault.", "NVRX_FAULT_DELAY", minimum=0.0
    )
    fault_types: str = _opt(
        "exception", "Fault kinds: exception, exit, hang (comma list).", "NVRX_FAULT_TYPES"
    )
    gpu_failure: str | None = _opt(
        None,
        "NVRX_INJECT_GPU_FAILURE schedule 'cycle:infra_rank,..' (unset: the mode's default, empty: off).",
        "NVRX_INJECT_GPU_FAILURE",
        pattern=(_GPU_FAILURE, "use 'cycle:infra_rank[,cycle:infra_rank..]', e.g. 1:0,2:0"),
    )
    # --- the chain's own guards ------------------------------------------------------------
    burn_guard: int = _opt(
        2,
        "Cancel the chain after N consecutive generations that never trained (0: off).",
        "NVRX_BURN_GUARD",
        minimum=0,
    )
    # --- bad nodes (drain awareness, and memory across generations) -----------------------
    # Minutes by default, as the reference's drain poller: a drain is not urgent (a drained
    # node leaves at the next rendezvous anyway), and sinfo is among slurmctld's heaviest
    # requests. Each poll is one sinfo and one squeue for the whole generation.
    drain_poll_interval: int = _opt(
        300,
        "Seconds between task 0's polls of Slurm for drained nodes; a drained node leaves "
        "at the next rendezvous (0: off).",
        "NVRX_DRAIN_POLL_INTERVAL",
        minimum=0,
    )
    # A slow node is always named (status, report, the watcher); replacing it costs a
    # restart, so it is done only where the chain opted in (docs/stragglers.md).
    straggler_action: str = _opt(
        "report",
        "What a persistently slow node (a straggler) gets: report (named only), or replace "
        "(it leaves at the next checkpoint and a spare joins, when what it costs until the "
        "generation ends exceeds the chain's measured restart cost).",
        "NVRX_STRAGGLER_ACTION",
        choices=STRAGGLER_ACTIONS,
    )
    exclude_after_failures: int = _opt(
        3,
        "Rank failures of one node in one generation that keep it out of the queued "
        "generations (0: never for rank failures).",
        "NVRX_EXCLUDE_AFTER_FAILURES",
        minimum=0,
    )
    # --- the training's own verdicts (settings/exit_actions.py) -------------------------
    # None: the workload's table (Megatron's 16 and 17; none for a script).
    workload_exits: str | None = _opt(
        None,
        "What a worker's exit code means to the chain: CODE=ACTION[,..] with ACTION "
        "restart, resume-elsewhere or stop-chain (unset: 16=resume-elsewhere,"
        "17=stop-chain for megatron and cpu, none for a script; empty: none).",
        "NVRX_WORKLOAD_EXITS",
    )
    # Two: a torn save and the one before it can both be bad after a storage fault; a
    # third bad one in a row is no longer bad luck, and a person should look.
    checkpoint_fallbacks: int = _opt(
        2,
        "Checkpoints a chain may set aside because they cannot be loaded, resuming from "
        "the one before each time (0: none; the chain stops at the first).",
        "NVRX_CHECKPOINT_FALLBACKS",
        minimum=0,
    )
    # A day: long enough to keep a black-hole node out of a chain's next generations,
    # short enough that a node an administrator repaired comes back without anyone's help.
    exclude_for: int = _opt(
        86400,
        "Seconds a bad node stays excluded from the chain's queued generations (0: no "
        "memory across generations).",
        "NVRX_EXCLUDE_FOR",
        minimum=0,
    )
    # Five seconds: a dump costs about 8 ms of one core (docs/hangs.md), 0.16 % of a core
    # per rank, and a hang is seen in three alike samples well within any step timeout.
    stack_sampling: int = _opt(
        5,
        "Seconds between two samples of each rank's stack (py-spy), from which a hang names "
        "the node the others wait on (0: off; no hang names a node).",
        "NVRX_STACK_SAMPLING",
        minimum=0,
    )


_FIELDS = {f.name: f for f in dataclasses.fields(ChainSpec)}


@dataclass(frozen=True)
class Shape:
    """What the spec implies, computed once at submit."""

    array_size: int  # tasks in one generation's array
    active_tasks: int  # admitted at once: train tasks + hot spares (the %throttle)
    array_spec: str  # sbatch --array value, e.g. "0-5%3"
    min_nodes: int  # ft_launcher --nnodes MIN
    max_nodes: int  # ft_launcher --nnodes MAX
    nproc_per_node: int
    world_size: int  # ranks that train: min_nodes x nproc_per_node
    # The parallel shape, from the settings and the user's arguments (settings/megatron/parallel.py).
    tensor_parallel: int
    pipeline_parallel: int
    context_parallel: int
    expert_parallel: int
    expert_tensor_parallel: int
    virtual_pipeline: int  # 0: no interleaving
    data_parallel: int  # world / (TP x PP x CP), as Megatron's data_parallel_size
    micro_batch: int
    global_batch: int
    microbatches: int  # per step: global batch / (micro batch x data-parallel)


# The settings that are sizes of the parallel shape (Megatron's only; parallel.SIZE_FLAGS
# names the flag each may also be stated by, the virtual stages apart).
PARALLEL_SETTINGS = (
    "tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel",
    "expert_tensor_parallel", "virtual_pipeline",
)  # fmt: skip


def parallel_of(spec: ChainSpec) -> tuple[parallel.Parallel, list[parallel.Conflict]]:
    """The run's parallel sizes and batch, and the conflicts between the settings and
    the user's arguments. Only Megatron is split model-parallel: every other workload
    is data-parallel over the whole world."""
    settings = {name: getattr(spec, name) for name in parallel.SIZE_FLAGS}
    if spec.workload != "megatron":
        return parallel.Parallel(
            micro_batch=spec.micro_batch or 1, global_batch=spec.global_batch
        ), []
    return parallel.stated(settings, spec.megatron_args, spec.virtual_pipeline)


def derive(spec: ChainSpec) -> Shape:
    active = spec.train_tasks + spec.hot_spares
    size = active + spec.cold_spares
    world = spec.train_tasks * spec.nodes_per_task * spec.gpus_per_node
    p, _ = parallel_of(spec)
    dp = p.data_parallel(world)
    gbs = p.global_batch_for(world)
    return Shape(
        array_size=size,
        active_tasks=active,
        array_spec=f"0-{size - 1}%{active}",
        min_nodes=spec.train_tasks * spec.nodes_per_task,
        max_nodes=active * spec.nodes_per_task,
        nproc_per_node=spec.gpus_per_node,
        world_size=world,
        tensor_parallel=p.tensor,
        pipeline_parallel=p.pipeline,
        context_parallel=p.context,
        expert_parallel=p.expert,
        expert_tensor_parallel=p.expert_tensor_size,
        virtual_pipeline=p.virtual_pipeline,
        data_parallel=dp,
        micro_batch=p.micro_batch,
        global_batch=gbs,
        microbatches=gbs // (p.micro_batch * p.batch_parallel(world)) if dp else 0,
    )


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec: the option to change and how."""

    option: str  # the CLI flag, e.g. "--train-tasks"
    message: str

    def __str__(self) -> str:
        return f"{self.option}: {self.message}"


def flag(name: str) -> str:
    """The CLI flag of a setting: its `flag` metadata, else the field name dashed."""
    meta = _FIELDS[name].metadata if name in _FIELDS else {}
    return meta.get("flag") or "--" + name.replace("_", "-")


def is_count(text: str) -> bool:
    return bool(_COUNT.fullmatch(text))


def control_character(text: str) -> str | None:
    """The first control character in text (newline, tab, escape...), or None.

    Every string setting can reach the batch script or an #SBATCH line, where a
    newline starts a command of its own; quoting cannot make one harmless there.
    """
    return next((c for c in text if unicodedata.category(c) == "Cc"), None)


def parse_mounts(text: str) -> list[tuple[str, str, bool]]:
    """Container mounts in pyxis's syntax, SRC[:DST[:ro|rw]][,..] (Apptainer's --bind and
    the stand-in read it the same way) -> (src, dst, read_only). Raises ValueError
    naming the entry: pyxis and Apptainer would split a bad one some other way."""
    mounts = []
    for item in text.split(",") if text else []:
        fields = item.split(":")
        if len(fields) > 3 or not all(fields):
            raise ValueError(f"{item!r} is not SRC[:DST[:ro|rw]]")
        src, dst = fields[0], fields[1] if len(fields) > 1 else fields[0]
        flags = fields[2] if len(fields) > 2 else "rw"
        if flags not in ("ro", "rw"):
            raise ValueError(f"{item!r} has flag {flags!r}; use ro or rw")
        if not (src.startswith("/") and dst.startswith("/")):
            raise ValueError(f"{item!r} needs absolute paths on both sides")
        mounts.append((src, dst, flags == "ro"))
    return mounts


def _mounts_problem(spec: ChainSpec) -> Problem | None:
    """Why the container would not see the work dir at its own path, or None."""
    work_dir = spec.work_dir
    if "%" in work_dir:
        return Problem(
            flag("work_dir"), "contains '%', which Slurm expands in the --output path; rename it"
        )
    if effective_runtime(spec) not in CONTAINER_RUNTIMES:
        return None
    if "," in work_dir or ":" in work_dir:
        return Problem(
            flag("work_dir"), "contains ',' or ':', which container mounts cannot express"
        )
    try:
        mounts = parse_mounts(spec.mounts or "")
    except ValueError as exc:
        return Problem(flag("mounts"), str(exc))
    same = [dst.rstrip("/") for src, dst, _ in mounts if src == dst]
    if mounts and not any(work_dir == d or work_dir.startswith(d + "/") for d in same):
        return Problem(
            flag("mounts"),
            f"none mounts the work dir {work_dir} at the same path; add {work_dir}:{work_dir}",
        )
    return None


IMAGE_SUFFIXES = (".sqsh", ".squashfs", ".sif", ".simg")


def is_image_file(image: str) -> bool:
    """A path (to a .sqsh/.sif) rather than a registry reference."""
    return image.startswith(("/", "./", "../", "~")) or image.endswith(IMAGE_SUFFIXES)


def path_settings() -> list[dataclasses.Field]:
    """The settings that name a path (their `path` metadata says where it is read)."""
    return [f for f in spec_fields() if f.metadata.get("path")]


def is_path_value(name: str, value: str) -> bool:
    """Whether a path setting's value is a path at all: an image may be a registry
    reference, and empty means unset."""
    return bool(value) and (name != "image" or is_image_file(value))


def read_on_host(spec: ChainSpec, name: str) -> bool:
    """Whether submit's host sees the path where the nodes do, so that submit may make a
    relative one absolute: a host path, or a node path on bare metal."""
    where = _FIELDS[name].metadata.get("path")
    bare = effective_runtime(spec) not in CONTAINER_RUNTIMES
    return where == HOST_PATH or (where == NODE_PATH and bare)


def _path_problems(spec: ChainSpec) -> list[Problem]:
    """Every path a node reads must be absolute: the batch script runs in the work dir, a
    container wherever its image starts, and neither expands ~."""
    problems = []
    for field_ in path_settings():
        value = getattr(spec, field_.name)
        if not is_path_value(field_.name, value):
            continue
        where = field_.metadata["path"]
        target = value.removeprefix("unix://") if where == SOCKET_PATH else value
        if target.startswith("/"):
            continue
        if read_on_host(spec, field_.name):
            fix = "give it from /; the nodes run in the work dir, not where submit ran"
        elif where == NODE_PATH:
            fix = (
                f"under --runtime {effective_runtime(spec)} it is read inside the image, "
                "which neither starts where submit runs nor expands ~: give the absolute "
                "path the image (or a mount) holds it at"
            )
        else:
            fix = "each node dials its own socket: give it from / (or unix:///path)"
        problems.append(Problem(flag(field_.name), f"{value!r} is not an absolute path; {fix}"))
    return problems


def effective_profile(spec: ChainSpec) -> str:
    """An unset profile is none when the user brought arguments, else the small demo."""
    if spec.profile:
        return spec.profile
    return "none" if spec.megatron_args else "small"


def faults_active(spec: ChainSpec) -> bool:
    """Only a demo mode ever injects a workload fault, and only when asked to."""
    return spec.mode in DEMO_MODES and spec.fault_inject


def effective_mounts(spec: ChainSpec) -> str:
    """Unset mounts the work dir at the same path; explicitly empty mounts nothing."""
    return f"{spec.work_dir}:{spec.work_dir}" if spec.mounts is None else spec.mounts


def effective_runtime(spec: ChainSpec) -> str:
    if spec.runtime:
        return spec.runtime
    return "pyxis" if spec.image else "bare"


def field_problem(name: str, value: Any) -> str | None:
    """What is wrong with one setting's value by its own declaration (type, bounds,
    choices, pattern), or None. The rules that relate several settings are check()'s."""
    return declared.problem(_FIELDS[name], value)


def check(spec: ChainSpec) -> list[Problem]:
    """Everything that can be judged from the spec alone (no file system, no Slurm):
    each setting by its declaration, then the rules that relate several."""
    problems: list[Problem] = []

    def bad(name: str, message: str) -> None:
        problems.append(Problem(flag(name), message))

    values = to_dict(spec)
    for name, value in values.items():
        texts = value if isinstance(value, list) else [value]
        found = next((c for t in texts if isinstance(t, str) and (c := control_character(t))), None)
        if found:
            bad(name, f"contains the control character {found!r}; remove it")
    if problems:
        return problems  # the checks below would only say the same about those values

    for name, value in values.items():
        wrong_type = declared.type_problem(_FIELDS[name], value)
        if wrong_type:
            bad(name, wrong_type)
    if problems:
        return problems  # a run.json edited by hand: the rules below would do arithmetic

    misjudged: set[str] = set()
    for name, value in values.items():
        message = field_problem(name, value)
        if message:
            bad(name, message)
            misjudged.add(name)
    # The rules below relate settings by arithmetic: only values sound on their own reach them.
    sound = not misjudged & {"stack_sampling", "step_timeout"}
    if sound and spec.stack_sampling > 0 and 3 * spec.stack_sampling > spec.step_timeout:
        bad(
            "stack_sampling",
            f"{spec.stack_sampling} s leaves fewer than three samples within the step timeout "
            f"({spec.step_timeout} s), too few to tell a hang; use at most "
            f"{spec.step_timeout // 3} s, or 0 to turn sampling off",
        )
    silence = spec.node_silence_timeout
    if "node_silence_timeout" not in misjudged and 0 < silence < MIN_SILENCE_S:
        bad(
            "node_silence_timeout",
            f"{silence} s is fewer than {MIN_SILENCE_S} liveness beats (one a second): a "
            "datagram or two lost on a busy network would be taken for a death; use at "
            f"least {MIN_SILENCE_S} s, or 0 to turn liveness off",
        )
    if not misjudged & {"lease_stale_after", "closed_flag_grace"}:
        margins = lease.problem(spec.lease_stale_after, spec.closed_flag_grace)
        if margins:
            bad("lease_stale_after", margins)
    if effective_runtime(spec) in CONTAINER_RUNTIMES and not spec.image:
        bad(
            "image",
            f"runtime {effective_runtime(spec)} needs an image; pass --image or --runtime bare",
        )
    if effective_runtime(spec) not in CONTAINER_RUNTIMES and spec.image:
        bad(
            "image",
            f"{spec.image} would not be used: --runtime {effective_runtime(spec)} runs on the "
            "nodes' own file system; drop --image, or pick a container runtime (pyxis, "
            "apptainer)",
        )
    problems += _path_problems(spec)
    mounts_problem = _mounts_problem(spec)
    if mounts_problem:
        problems.append(mounts_problem)
    problems += _workload_problems(spec)
    if spec.workload_exits is not None:
        try:
            exit_actions.parse(spec.workload_exits)
        except exit_actions.TableError as exc:
            bad("workload_exits", f"{exc}; e.g. --workload-exits 16=resume-elsewhere,17=stop-chain")
    if spec.segment not in ("auto", "off") and not (
        is_count(spec.segment) and int(spec.segment) >= 1
    ):
        bad("segment", f"{spec.segment!r} is not auto, off, or a node count >= 1")
    types = [t for t in spec.fault_types.split(",") if t]
    if faults_active(spec) and (not types or any(t not in FAULT_TYPES for t in types)):
        bad("fault_types", f"{spec.fault_types!r}: use a comma list of {', '.join(FAULT_TYPES)}")
    ranks = [r for r in spec.fault_ranks.split(",") if r]
    if faults_active(spec) and (not ranks or not all(map(is_count, ranks))):
        bad("fault_ranks", f"{spec.fault_ranks!r}: use a comma list of global rank numbers")

    if problems:
        return problems  # the arithmetic below assumes sane numbers

    shape = derive(spec)
    p, conflicts = parallel_of(spec)
    problems += [Problem(flag(c.setting), c.message) for c in conflicts]
    problems += [
        Problem(flag(name), message) for name, message in parallel.problems(p, shape.world_size)
    ]
    if faults_active(spec) and max(map(int, ranks)) >= shape.world_size:
        bad(
            "fault_ranks",
            f"rank {max(map(int, ranks))} is outside the world of {shape.world_size} ranks "
            f"(0-{shape.world_size - 1}); pick ranks below {shape.world_size}",
        )
    if is_count(spec.segment) and shape.min_nodes % int(spec.segment):
        # NVRx selects whole segments: its rendezvous raises on every cycle otherwise.
        bad(
            "segment",
            f"NVRx needs the minimum world of {shape.min_nodes} nodes to be a multiple of "
            f"the segment {spec.segment}; pick a segment that divides it, or auto",
        )
    return problems


def _workload_problems(spec: ChainSpec) -> list[Problem]:
    """The user's own arguments and script: where they belong and what they may not say."""
    problems: list[Problem] = []

    def bad(name: str, message: str) -> None:
        problems.append(Problem(flag(name), message))

    if spec.megatron_args and spec.workload != "megatron":
        bad("megatron_args", f"applies to --workload megatron, not {spec.workload}")
    if spec.cpu_step_pause and spec.workload != "cpu":
        bad("cpu_step_pause", f"applies to --workload cpu, not {spec.workload}; leave it 0")
    if spec.script_args and spec.workload != "script":
        bad("script_args", f"applies to --workload script, not {spec.workload}; use --script")
    if spec.script and spec.workload != "script":
        bad("script", f"applies to --workload script, not {spec.workload}")
    if spec.workload == "script":
        if not spec.script:
            bad("script", "--workload script needs your script: pass --script /path/train.py")
        if faults_active(spec):
            bad(
                "fault_inject",
                f"a script workload injects no faults of its own, so --mode {spec.mode} "
                "cannot make it fail; pass --no-fault-inject (a handoff demo still fails "
                "task 0's node through NVRx's GPU-failure injector)",
            )
    if spec.workload == "megatron":
        problems += _megatron_problems(spec)
    else:
        for name in PARALLEL_SETTINGS:
            if getattr(spec, name):
                bad(name, f"applies to --workload megatron; a {spec.workload} workload is "
                    "data-parallel over every rank: leave it unset")  # fmt: skip
    return problems


def _megatron_problems(spec: ChainSpec) -> list[Problem]:
    run = megatron_rules.Run(
        args=spec.megatron_args,
        profile=effective_profile(spec),
        train_samples=spec.train_samples,
        save_retention=spec.save_retention,
        async_save=spec.async_save,
    )
    return [Problem(flag(name), line) for name, line in megatron_rules.problems(run)]


def spec_fields() -> list[dataclasses.Field]:
    return list(dataclasses.fields(ChainSpec))


def to_dict(spec: ChainSpec) -> dict[str, Any]:
    return dataclasses.asdict(spec)


def from_dict(data: dict[str, Any]) -> ChainSpec:
    """Rebuild a spec from run.json; unknown keys are an error, missing ones take defaults."""
    names = {f.name for f in spec_fields()}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown chain settings: {', '.join(unknown)}")
    return ChainSpec(**data)


# The reference deployment's --train-samples: far more than one generation can train, so a generation
# ends by its time limit, the exit duration or a fault, never by running out of samples.
DEFAULT_TRAIN_SAMPLES = 10_485_760


def train_samples(spec: ChainSpec) -> int:
    """What every workload is told to train for (the cpu trainer and Megatron agree)."""
    return spec.train_samples or DEFAULT_TRAIN_SAMPLES


def shown_default(field: dataclasses.Field) -> str:
    """A setting's default as help and docs show it."""
    if field.default_factory is not dataclasses.MISSING:
        return "none" if not field.default_factory() else str(field.default_factory())
    default = field.default
    if isinstance(default, bool):
        return "on" if default else "off"
    if default is None:
        return "unset"
    return "empty" if default == "" else str(default)
