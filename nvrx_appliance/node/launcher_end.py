"""Task 0's early word that its ft_launcher has decided to end the generation.

When task 0's node fails NVRx's health check at a rendezvous (a GPU off the bus, an
XID: the commonest loss of task 0 on a GPU cluster), NVRx 0.7.0's launcher logs
"Job array deployment: exiting with code 1 for replacement." and then, before it exits:
waits 3.0 s as the store host (hard-coded, for peers to read a permanent-close key that
this path does not even set), and stops its gRPC log server, which waits for every
connected client (our peers' ft_launchers, still in the rendezvous and waiting on the
store that lives until task 0's launcher is gone) up to
--ft-log-server-graceful-shutdown-timeout, then up to 5.0 s more in gRPC's stop
(hard-coded) for a stream still open. About 14 s in which every node of the generation
idles, measured on the local cluster.

Task 0 reads that line from ft_launcher's own log (--ft-nvrx-logfile, written by the log
server within its 1 s flush) as the log grows, and writes the closed flag at once: the
peers leave on it (the watchers look twice a second), their streams close before the
log server is told to stop, and neither wait is spent. Task 0's own ft_launcher is left
to end on its own, with its own exit code: the teardown still decides on that code.
"""

from __future__ import annotations

import re
from pathlib import Path

from nvrx_appliance.observe import workdir

# launcher.py (NVRx 0.7.0), on UnhealthyNodeException in a Slurm job array. Every node's
# launcher logs into the same file, each line behind its host name
# ("2026-12-03 07:34:02,129 [INFO] [node1] [workload:?(?) infra:0(0)] launcher.py:1728 ..."):
# only task 0's own line ends the generation; a peer's is an in-job replacement.
DECIDED = re.compile(
    r"\] \[(?P<host>[^\]]+)\] \[[^\]]*\] \S+ "
    r"Job array deployment: exiting with code (?P<code>\d+) for replacement"
)


class EndWatch:
    """Reads ft_launcher's log as it grows for its decision to end the generation."""

    def __init__(self, log: Path, host: str) -> None:
        self.log, self.host = log, host
        self._tail = workdir.Tail()
        self.decided: str | None = None  # why, once seen
        self.code: int | None = None  # the exit code it said it would end with

    def look(self) -> str | None:
        """The decision, if the log has it now (once seen, always)."""
        if self.decided is None:
            for line in workdir.appended_lines(self.log, self._tail):
                found = DECIDED.search(line)
                if found and found["host"] == self.host:
                    self.code = int(found["code"])
                    self.decided = (
                        f"task 0's ft_launcher decided to end the generation: its node failed "
                        f"NVRx's health check (exiting with code {found['code']} for replacement)"
                    )
                    break
        return self.decided
