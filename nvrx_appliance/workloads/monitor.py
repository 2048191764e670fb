"""NVRx's rank monitor, as the cpu trainer uses it: the setup, step and checkpointing sections.

Under ft_launcher every rank has a rank monitor server (its socket is in the rank's
environment); a section left open longer than ft_launcher's --ft-rank-section-timeouts
gets the rank killed and the cycle restarted. That is how a hung step is caught: the
trainer never times itself out.

The timeouts stay the ones the run manifest gave ft_launcher. NVRx can also calculate
timeouts from observed section times and persist them through the client's state_dict,
but calculated ones take precedence over configured ones, which would silently replace
the operator's settings; the trainer does not use them.
"""

from __future__ import annotations

import os

# nvidia_resiliency_ext.fault_tolerance.data.FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR; read
# here without importing NVRx so the trainer also runs under plain torchrun.
SOCKET_ENV = "FT_RANK_MONITOR_IPC_SOCKET"

SETUP = "setup"
STEP = "step"
CHECKPOINTING = "checkpointing"


class Sections:
    def __init__(self) -> None:
        self._client = None
        if os.environ.get(SOCKET_ENV):
            from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

            self._client = RankMonitorClient()
            self._client.init_workload_monitoring()

    @property
    def monitored(self) -> bool:
        return self._client is not None

    def start(self, section: str) -> None:
        if self._client is not None:
            self._client.start_section(section)

    def end(self, section: str) -> None:
        if self._client is not None:
            self._client.end_section(section)

    def shutdown(self) -> None:
        if self._client is not None:
            self._client.shutdown_workload_monitoring()
            self._client = None
