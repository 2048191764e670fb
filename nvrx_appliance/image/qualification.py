"""Qualification: did an image's combination recover on this cluster? The record. Pure.

NVRx's Megatron-LM guide asks, before relying on a combination of revisions, for
recovery checks run for real: a checkpoint completed before the fault, the successor
resumed from exactly that iteration, and training went on. `nvrx-appliance qualify`
gathers the evidence from one hand-off demo (the ledger, the tracker, and the cpu
trainer's progress log or Megatron-LM's own log line) and judges it here.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SCHEMA = "nvrx-appliance/qualification"
VERSION = 1
RECORD_SUFFIX = ".qualification.json"  # next to the image: <image>.qualification.json
NO_RESTART = 93
# Megatron-LM's log line once a checkpoint is loaded:
# "successfully loaded checkpoint from <dir> [ t 1/1, p 1/1 ] at iteration 40"
_MEGATRON_LOADED = re.compile(r"loaded checkpoint from .* at iteration (\d+)")
# What makes two images the same combination for qualification purposes.
_PINNED = ("appliance_version", "entrypoint_protocol", "nvrx_version", "megatron_commit", "base")
_PROBED = ("python", "pytorch", "cuda", "nccl", "transformer_engine", "nvrx", "megatron_commit")

CHECKPOINT_BEFORE_FAULT = "checkpoint completed before the fault"
RESUMED_EXACTLY = "successor resumed from exactly that iteration"
TRAINING_WENT_ON = "training went on"


@dataclass(frozen=True)
class Evidence:
    first: str  # the generation that loses task 0
    second: str  # its successor
    ledger: list[dict[str, Any]]  # chain.jsonl
    events: list[dict[str, Any]]  # the cpu trainer's progress log (empty for Megatron-LM)
    megatron_resumed: int | None  # iteration in Megatron-LM's "loaded checkpoint" line
    tracker: int | None  # latest_checkpointed_iteration.txt now
    chain_live: bool  # anything of the chain still queued or running


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool | None  # None: not decided yet
    detail: str


def combination(image_manifest: dict[str, Any]) -> dict[str, Any]:
    probed = image_manifest.get("probed", {})
    return {
        **{key: image_manifest.get(key) for key in _PINNED},
        "probed": {key: probed.get(key) for key in _PROBED},
    }


def megatron_resumed_iteration(log_text: str) -> int | None:
    found = _MEGATRON_LOADED.findall(log_text)
    return int(found[-1]) if found else None


def _entry(evidence: Evidence, array_job_id: str) -> dict[str, Any] | None:
    return next((e for e in evidence.ledger if str(e.get("array_job_id")) == array_job_id), None)


def _successor_start(evidence: Evidence) -> dict[str, Any] | None:
    return next(
        (
            e
            for e in evidence.events
            if e.get("event") == "start" and str(e.get("slurm_array_job_id")) == evidence.second
        ),
        None,
    )


def progress(evidence: Evidence) -> str:
    """Where the qualification run stands, in one line (printed while it waits)."""
    if _successor_start(evidence) or evidence.megatron_resumed is not None:
        where = f"generation {evidence.second} resumed"
    elif _entry(evidence, evidence.first):
        where = f"generation {evidence.first} ended; waiting for {evidence.second} to start"
    elif any(e.get("event") == "fault" for e in evidence.events):
        where = f"fault injected in generation {evidence.first}; waiting for the hand-off"
    elif any(e.get("event") in ("step", "checkpoint") for e in evidence.events):
        where = f"generation {evidence.first} training"
    else:
        where = f"waiting for generation {evidence.first} to train"
    tracker = "none yet" if evidence.tracker is None else f"iteration {evidence.tracker}"
    return f"{where}; last checkpoint: {tracker}"


def _checkpoint_check(evidence: Evidence) -> tuple[Check, int | None]:
    first = _entry(evidence, evidence.first)
    if first is None:
        return Check(
            CHECKPOINT_BEFORE_FAULT, None, f"generation {evidence.first} has not ended"
        ), None
    if first.get("exit_code") == NO_RESTART:
        return (
            Check(
                CHECKPOINT_BEFORE_FAULT,
                False,
                "NVRx stopped the chain with 93 instead of handing off",
            ),
            None,
        )
    iteration = first.get("checkpoint_iteration")
    if not iteration:
        return (
            Check(
                CHECKPOINT_BEFORE_FAULT,
                False,
                f"generation {evidence.first} ended with no complete checkpoint",
            ),
            None,
        )
    if evidence.events and not any(
        e.get("event") == "checkpoint" and e.get("iteration") == iteration for e in evidence.events
    ):
        return (
            Check(
                CHECKPOINT_BEFORE_FAULT,
                False,
                f"the tracker says {iteration}, but no checkpoint was written there",
            ),
            None,
        )
    detail = (
        f"generation {evidence.first} lost task 0 after checkpoint iteration {iteration} "
        f"(exit {first.get('exit_code')}, {first.get('action')})"
    )
    return Check(CHECKPOINT_BEFORE_FAULT, True, detail), int(iteration)


def _resumed_check(evidence: Evidence, iteration: int) -> tuple[Check, float | None]:
    start = _successor_start(evidence)
    if start is not None:
        resumed, when = start.get("iteration"), start.get("time")
    else:
        resumed, when = evidence.megatron_resumed, None
    if resumed is None:
        return Check(
            RESUMED_EXACTLY, None, f"generation {evidence.second} has not resumed yet"
        ), None
    if resumed != iteration:
        return (
            Check(
                RESUMED_EXACTLY,
                False,
                f"generation {evidence.second} resumed at {resumed}, not {iteration}",
            ),
            None,
        )
    return Check(
        RESUMED_EXACTLY, True, f"generation {evidence.second} resumed at iteration {iteration}"
    ), when


def _went_on_check(evidence: Evidence, iteration: int, resumed_at: float | None) -> Check:
    later = [
        e["iteration"]
        for e in evidence.events
        if e.get("event") == "checkpoint"
        and resumed_at is not None
        and e.get("time", 0) > resumed_at
        and e.get("iteration", 0) > iteration
    ]
    reached = max(later) if later else evidence.tracker
    if reached is not None and reached > iteration:
        return Check(TRAINING_WENT_ON, True, f"checkpoint iteration {reached} after the resume")
    return Check(TRAINING_WENT_ON, None, f"no checkpoint beyond {iteration} yet")


def judge(evidence: Evidence) -> list[Check]:
    """The three checks; undecided ones fail once nothing of the chain is left to run."""
    checks: list[Check] = []
    first, iteration = _checkpoint_check(evidence)
    checks.append(first)
    if iteration is not None:
        resumed, when = _resumed_check(evidence, iteration)
        checks.append(resumed)
        if resumed.passed:
            checks.append(_went_on_check(evidence, iteration, when))
    names = {c.name for c in checks}
    for name in (CHECKPOINT_BEFORE_FAULT, RESUMED_EXACTLY, TRAINING_WENT_ON):
        if name not in names:
            checks.append(Check(name, None, "waiting for the checks before it"))
    if not evidence.chain_live:
        checks = [
            c
            if c.passed is not None
            else Check(c.name, False, f"the chain ended first: {c.detail}")
            for c in checks
        ]
    return checks


def verdict(checks: list[Check]) -> str:
    if any(c.passed is False for c in checks):
        return "failed"
    if all(c.passed for c in checks):
        return "passed"
    return "pending"


def timed_out(checks: list[Check], seconds: float) -> list[Check]:
    return [
        c
        if c.passed is not None
        else Check(c.name, False, f"not seen within {seconds:.0f} s: {c.detail}")
        for c in checks
    ]


def record(
    *,
    image: str,
    image_manifest: dict[str, Any],
    checks: list[Check],
    cluster: dict[str, Any],
    chain: dict[str, Any],
    started: str,
    finished: str,
    tool_version: str,
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "result": verdict(checks),
        "image": image,
        "combination": combination(image_manifest),
        "image_manifest": image_manifest,
        "checks": [asdict(c) for c in checks],
        "cluster": cluster,
        "chain": chain,
        "started": started,
        "finished": finished,
        "tool_version": tool_version,
    }


def record_path(image: str | Path) -> Path:
    image = Path(image)
    return image.with_name(image.name + RECORD_SUFFIX)


def matches(qualification: dict[str, Any], image_manifest: dict[str, Any]) -> bool:
    """Does a passed record vouch for this image's combination?"""
    return (
        qualification.get("schema") == SCHEMA
        and qualification.get("result") == "passed"
        and qualification.get("combination") == combination(image_manifest)
    )


def stack_sampling(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether each node's rank guards could read their ranks' stacks (rank/sampler.py),
    from the samples of the qualification run: a hang is attributed from them, so a node
    where the kernel refused py-spy (Yama's ptrace_scope, no CAP_SYS_PTRACE) is one where
    a hang names nobody. {"sampled": [nodes], "refused": {node: py-spy's words and the fix}}."""
    sampled: set[str] = set()
    refused: dict[str, str] = {}
    for sample in samples:
        node = str(sample.get("node", ""))
        if sample.get("no_stacks"):
            refused.setdefault(node, str(sample["no_stacks"]))
        elif sample.get("frames"):
            sampled.add(node)
    return {"sampled": sorted(sampled - set(refused)), "refused": dict(sorted(refused.items()))}


def stack_lines(found: dict[str, Any]) -> list[str]:
    """What qualify says about stack sampling, one line per fact."""
    lines = [f"stacks cannot be sampled on {node}: {why}" for node, why in found["refused"].items()]
    if found["sampled"]:
        lines.append("stacks sampled on " + ", ".join(found["sampled"]))
    if not found["sampled"] and not found["refused"]:
        lines.append("no stacks were sampled (--stack-sampling 0, or no rank ran long enough)")
    return lines
