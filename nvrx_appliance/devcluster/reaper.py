"""`python -m nvrx_appliance.devcluster.reaper CMD...`: run CMD (slurmd) under a parent
that reaps every orphan below it at once, as systemd does on a real node.

Why: srun leaves an orphaned child when a job step ends. Orphans go to the nearest
child subreaper, else to PID 1, and this VM's PID 1 reaps late; until it does, the
zombie keeps the job's process group alive, and slurmstepd (proctrack/pgid) polls it
for 3 s more before it reports the job done. A benchmark would measure that VM, not
the appliance. With this parent marked a child subreaper, the orphans of every job on
the node come here and are reaped the moment they exit.

The command's exit status is ours; TERM, INT and HUP are passed on to it, so stopping
this process stops the daemon as before.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def run(argv: list[str]) -> int:
    become_subreaper()
    child = os.fork()
    if child == 0:
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    for sig in PASSED_ON:
        signal.signal(sig, lambda signum, _frame: os.kill(child, signum))
    while True:
        pid, status = os.wait()  # any child: the daemon, or an orphan handed to us
        if pid == child:
            return os.waitstatus_to_exitcode(status) % 256


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m nvrx_appliance.devcluster.reaper COMMAND [ARG...]")
    sys.exit(run(sys.argv[1:]))
