"""Every environment name, option and config key the reference deployment reads, as
read from it (no tests here; tests/unit/test_reference_names.py holds us to it).

Source: NVIDIA/nvidia-resiliency-ext at commit d8686d9c7015c39ce91dd01788c0ab111a24818b
(2026-08-07), examples/fault_tolerance/deployment/: chain/nvrx_singleton_array.sbatch,
chain/submit_chain.sh, chain/README.md, watch/README.md, watch/nvrx_watch/config.py and
watch/nvrx_watch/__main__.py; read on 2026-12-02 by `${NAME...}` expansions in the two
scripts, the knobs the READMEs list, `Config`'s fields (NVRX_WATCH_<FIELD>) and the
argparse options. Each value is the reference's own default, so a test can set exactly
what a user of the reference had. Update this list from a newer reference, never from
our code.
"""

# The sbatch and submit_chain.sh: name -> the reference's default ("" where its default is
# empty or computed; a value given here instead where an empty one is not a valid setting).
SCRIPTS = {
    # shape
    "NVRX_TRAIN_TASKS": "1",
    "NVRX_HOT_SPARES": "1",
    "NVRX_COLD_SPARES": "3",
    "NODES_PER_TASK": "1",
    "GPUS_PER_NODE": "4",
    "NVRX_ACTIVE_TASKS": "2",  # submit_chain.sh exports train + hot; the sbatch reads it
    "NVRX_CHAIN_DEPTH": "4",
    "NVRX_JOB_NAME": "nvrx_singleton",
    "NVRX_TIME_LIMIT": "00:25:00",
    # workload
    "NVRX_WORK_DIR": "/shared/alice/nvrx-run",  # ${PWD}/nvrx-run
    "MEGATRON_PATH": "/workspace/megatron-lm",
    "NVRX_MODEL_PROFILE": "small",
    "NVRX_CONTAINER_IMAGE": "",
    "NVRX_CONTAINER_MOUNTS": "/lustre:/lustre",
    "MICRO_BATCH_SIZE": "1",
    "GLOBAL_BATCH_SIZE": "4",  # the world size by default
    "TENSOR_PARALLEL": "1",
    "PIPELINE_PARALLEL": "1",
    "SAVE_INTERVAL": "20",
    "SAVE_RETAIN_INTERVAL": "10000",
    "TRAIN_SAMPLES": "10485760",
    "LR_DECAY_SAMPLES": "1038336",
    "EXIT_DURATION_IN_MINS": "110",
    # NVRx
    "NVRX_MAX_RESTARTS": "7",
    "NVRX_JOIN_TIMEOUT": "1200",
    "NVRX_STORE_CONNECT_WAIT": "300",
    "NVRX_RDZV_HOST_WAIT": "300",
    "NVRX_HEALTH_CHECK_ENDPOINT": "",
    "NVRX_SEGMENT": "1",
    "NVRX_GPUS_PER_NUMA": "2",
    "NVRX_LOG_DEBUG": "true",
    "NVRX_MAX_NO_PROGRESS_CYCLES": "1",  # empty by default (NVRx's 3); the demo sets 1
    "NVRX_NO_RESTART_EXIT_CODE": "93",
    "RDZV_PORT": "29400",
    "NCCL_MNNVL_ENABLE": "0",
    # the demo modes and fault injection
    "NVRX_NO_RESTART_DEMO": "1",
    "NVRX_FAULT_INJECT": "1",
    "NVRX_FAULT_RANKS": "2",
    "NVRX_FAULT_DELAY": "60",
    "NVRX_FAULT_TYPES": "async_exc",
    "NVRX_INJECT_GPU_FAILURE": "1:0,2:0",
    # submit_chain.sh only
    "NVRX_DRY_RUN": "1",
}

# Read by the scripts but set by Slurm or the login shell, not by a user of the reference.
NOT_SETTINGS = (
    "SLURM_ARRAY_JOB_ID", "SLURM_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NUM_NODES",
    "SLURM_NODELIST", "SLURM_JOB_NAME", "SLURM_JOB_USER", "SLURM_NODEID",
    "USER", "HOME", "PWD",
)  # fmt: skip

# The watcher: NVRX_WATCH_<FIELD> for every field of its Config, and the two names it
# takes from the scripts. name -> a value the reference would accept.
WATCHER_ENV = {
    "NVRX_WATCH_JOB_ID": "5728163",
    "NVRX_WATCH_JOB_NAME": "nvrx_singleton",
    "NVRX_WATCH_WORK_DIR": "/shared/alice/nvrx-run",
    "NVRX_WATCH_CYCLE_INFO_GLOB": "/shared/alice/nvrx-run/nvrx/*/cycle_infos/cycle_info.*",
    "NVRX_WATCH_CHECKPOINT_ITERATION_FILE": "/shared/alice/nvrx-run/checkpoints/it.txt",
    "NVRX_WATCH_PLATFORM": "none",
    "NVRX_WATCH_MAX_RESTARTS": "7",
    "NVRX_WATCH_DRY_RUN": "1",
    "NVRX_WATCH_OBSERVE_ONLY": "0",
    "NVRX_WATCH_USER": "alice",
    "NVRX_WATCH_STATE_DIR": "/home/alice/.nvrx_watch",
    "NVRX_WATCH_EXPECT_FILE": "/home/alice/.nvrx_watch_expect_chain",
    "NVRX_WATCH_COMMAND_TIMEOUT": "30",
    "NVRX_WATCH_ALERT_COOLDOWN": "3600",
    "NVRX_WATCH_GRACE": "120",
    "NVRX_WATCH_CHURN_WINDOW": "21600",
    "NVRX_WATCH_MAX_GENERATIONS_PER_WINDOW": "3",
    "NVRX_WATCH_NO_RESTART_EXIT_CODE": "42",
    "NVRX_WATCH_STORM_CYCLES": "5",
    "NVRX_WATCH_STORM_WINDOW": "1800",
    "NVRX_WATCH_STALL_CYCLES": "3",
    "NVRX_WATCH_STALL_SECONDS": "3600",
    "NVRX_WATCH_SHORT_CYCLE_SECONDS": "600",
    "NVRX_WATCH_SUSPECT_CYCLES": "3",
    "NVRX_WATCH_BUDGET_FRACTION": "0.8",
    "NVRX_WATCH_HEARTBEAT_URL": "https://hc-ping.example/3f2a",
    "NVRX_WATCH_PD_ROUTING_KEY": "R0UTING-KEY-of-the-readme",  # the README's cron line
    "NVRX_WATCH_WEBHOOK_URL": "https://hooks.example/T0KEN",
    "NVRX_WATCH_LOG_FILE": "/home/alice/.nvrx_watch/watch.log",
    "NVRX_WATCH_DISABLE": "suspect_node",
    "NVRX_WORK_DIR": "/shared/alice/nvrx-run",
    "NVRX_JOB_NAME": "nvrx_singleton",
}

# The watcher's command line (argparse), each option as spelled there.
WATCHER_OPTIONS = (
    "--config", "--job-name", "--work-dir", "--cycle-info-glob", "--checkpoint-iteration-file",
    "--platform", "--max-restarts", "--state-dir", "--user", "--act", "--disable",
    "--heartbeat-url", "--pd-routing-key", "--webhook-url", "--alert-cooldown", "--dry-run",
    "--interval", "--list-detectors", "-v", "--verbose",
)  # fmt: skip
