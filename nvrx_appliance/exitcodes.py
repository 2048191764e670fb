"""Exit codes are a contract between the entrypoint, srun, and task 0's teardown trap.

93 belongs to NVRx: ft_launcher exits 93 to say "do not restart", and the trap cancels
the whole chain on it. It must pass through us untouched, and none of our own failures
may ever use it, or a bug of ours would silently cancel a thousand-GPU chain.
"""

OK = 0
# Host-side usage errors (bad flag, bad config, refused submission): click's convention.
USAGE = 2
# NVRx ft_launcher: do not restart. Reserved; never returned for our own failures.
NVRX_NO_RESTART = 93

# The entrypoint's own failures. Distinct, documented, and far from 93.
MANIFEST_INVALID = 70  # run.json missing, unreadable, unknown version, inconsistent
TASK0_GONE = 71  # closed flag present or task 0's lease went stale: generation is over
RECORD_REFUSED = 72  # rendezvous record, control dir or checkpoint dir failed validation
SEGMENT_MISMATCH = 73  # this node disagrees with task 0's segment decision
RECORD_TIMEOUT = 74  # task 0 started but never published its record in time
LAUNCH_FAILED = 75  # ft_launcher could not be started at all
STOPPED_BY_CLOSED_FLAG = 76  # ft_launcher was running when the closed flag appeared
SELF_FENCED = 77  # task 0 could not refresh its lease in time and stopped its ft_launcher
# The workload gave its own verdict (a code its exit table maps to resume-elsewhere or
# stop-chain, or a checkpoint it could not load with nothing left to fall back to): every
# node stopped its ft_launcher, and task 0's teardown acts on the verdict file.
WORKLOAD_VERDICT = 78
# Task 0's liveness judge found this node dead (it stopped beating: frozen, cut off) and
# the cycle went on without it; it came back, and it leaves (node/liveness.py).
TAKEN_OUT = 79

ENTRYPOINT_CODES = {
    MANIFEST_INVALID: "run manifest missing, unreadable, of an unknown version, or inconsistent",
    TASK0_GONE: "task 0 is gone (closed flag, or its liveness lease went stale)",
    RECORD_REFUSED: "rendezvous record, control directory or checkpoint directory failed "
    "validation",
    SEGMENT_MISMATCH: "this node disagrees with task 0's segment decision",
    RECORD_TIMEOUT: "task 0 started but did not publish its rendezvous record in time",
    LAUNCH_FAILED: "ft_launcher could not be started",
    STOPPED_BY_CLOSED_FLAG: "ft_launcher was stopped because the generation was closed",
    SELF_FENCED: "task 0 could not refresh its liveness lease and stopped its own ft_launcher",
    WORKLOAD_VERDICT: "the workload gave its own verdict; ft_launcher was stopped on it",
    TAKEN_OUT: "task 0 judged this node dead (it stopped answering) and went on without it",
}

assert NVRX_NO_RESTART not in ENTRYPOINT_CODES
