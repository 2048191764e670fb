"""The save signal as a workload receives it (docs/workload-contract.md): a handler that
only raises a flag, read by the training loop between steps. Torch-free, so it is
installed before torch is imported: the entrypoint sends the signal as soon as every
worker catches it, and an early handler makes that moment early."""

from __future__ import annotations

import signal
import time


class SaveRequest:
    def __init__(self) -> None:
        self.at: float | None = None  # when the signal arrived (wall time)

    @property
    def requested(self) -> bool:
        return self.at is not None

    def install(self, signum: int) -> None:
        signal.signal(signum, self._received)

    def _received(self, _signum: int, _frame: object) -> None:
        if self.at is None:
            self.at = time.time()
