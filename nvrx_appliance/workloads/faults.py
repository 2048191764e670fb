"""The cpu trainer's fault plan: which rank faults, how, and when. Pure.

Kinds:
  exception  an exception escapes the training step (the process exits non-zero)
  exit       the process ends at once with EXIT_CODE, no cleanup
  hang       the step never returns; NVRx's step-section timeout must catch it

Several kinds rotate by cycle (cycle 0 the first, cycle 1 the second, ...), so a run is
reproducible; Megatron's injector instead draws one at random.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("exception", "exit", "hang")
# Any non-zero status but 93 (NVRx's "do not restart", which would end the chain) and
# Megatron's 16 and 17, which the default exit table turns into verdicts
# (settings/exit_actions.py): an injected fault is an ordinary failure, restarted in place.
EXIT_CODE = 13


@dataclass(frozen=True)
class FaultPlan:
    ranks: frozenset[int]
    kinds: tuple[str, ...]
    delay: float  # seconds after this cycle's training loop starts
    cycles: int  # fault only in cycles below this; 0: in every cycle


def parse_plan(ranks: str, kinds: str, delay: float, cycles: int) -> FaultPlan | None:
    """The plan from the trainer's flags; None when no rank is named. ValueError names the flag."""
    names = [r.strip() for r in ranks.split(",") if r.strip()]
    if not names:
        return None
    if not all(r.isdigit() for r in names):
        raise ValueError(
            f"--fault-injector-ranks {ranks!r}: use a comma list of global rank numbers"
        )
    chosen = tuple(k.strip() for k in kinds.split(",") if k.strip())
    if not chosen or any(k not in KINDS for k in chosen):
        raise ValueError(
            f"--fault-injector-fault-types {kinds!r}: use a comma list of {', '.join(KINDS)}"
        )
    if delay < 0:
        raise ValueError(f"--fault-injector-fault-delay {delay}: cannot be negative")
    if cycles < 0:
        raise ValueError(f"--fault-injector-cycles {cycles}: cannot be negative (0: every cycle)")
    return FaultPlan(frozenset(int(r) for r in names), chosen, delay, cycles)


def fault_for(plan: FaultPlan | None, rank: int, cycle: int) -> str | None:
    """The kind of fault this rank injects in this cycle, or None."""
    if plan is None or rank not in plan.ranks:
        return None
    if plan.cycles and cycle >= plan.cycles:
        return None
    return plan.kinds[cycle % len(plan.kinds)]


def due(plan: FaultPlan, seconds_training: float) -> bool:
    return seconds_training >= plan.delay
