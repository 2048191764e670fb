"""What the launcher tells each rank through its environment.

ft_launcher (like torchrun) sets RANK, WORLD_SIZE and LOCAL_RANK, and
TORCHELASTIC_RESTART_COUNT, which NVRx sets to its cycle number: 0 for the first cycle
of a generation, one more per in-job restart (the rendezvous round).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Rank:
    rank: int
    world: int
    local: int
    cycle: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Rank:
        return cls(
            rank=int(env.get("RANK", "0")),
            world=int(env.get("WORLD_SIZE", "1")),
            local=int(env.get("LOCAL_RANK", "0")),
            cycle=int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
        )
