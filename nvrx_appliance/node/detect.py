"""ClusterUUID detection from `nvidia-smi -q` text, and the segment decision.

NVRx finds a node's NVLink domain by reading a ClusterUUID line of `nvidia-smi -q`,
and `--ft-segment N` on a node without one makes its rendezvous raise on every cycle,
so the chain burns. We read the same text, but stricter than NVRx: every GPU must
report the same, real ClusterUUID, or the node has none.

Pure: the text comes in, verdicts go out. The subprocess lives in node_probe.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A GPU block starts at column 0 with its PCI bus id, e.g. "GPU 00000009:01:00.0".
_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_FIELD = re.compile(r"^\s+([^:]+?)\s*:\s*(.*?)\s*$")
_ATTACHED = re.compile(r"^Attached GPUs\s*:\s*(\d+)\s*$")


@dataclass(frozen=True)
class Gpu:
    bus_id: str
    name: str
    uuid: str
    cluster_uuid: str | None  # as printed ("N/A" included); None: no such line


@dataclass(frozen=True)
class Fabric:
    """This node's NVLink domain, as far as segment mode is concerned."""

    cluster_uuid: str | None  # None: no valid ClusterUUID on this node
    reason: str  # one line for an operator: why it is valid or not
    gpus: tuple[Gpu, ...] = ()

    @property
    def valid(self) -> bool:
        return self.cluster_uuid is not None


@dataclass(frozen=True)
class Listing:
    gpus: tuple[Gpu, ...]
    attached: int | None  # the "Attached GPUs" header, when printed


def parse(text: str) -> Listing:
    gpus: list[Gpu] = []
    attached = None
    current: dict[str, str] | None = None

    def close() -> None:
        if current is not None:
            gpus.append(
                Gpu(
                    bus_id=current["bus_id"],
                    name=current.get("Product Name", "?"),
                    uuid=current.get("GPU UUID", "?"),
                    cluster_uuid=current.get("ClusterUUID"),
                )
            )

    for line in text.splitlines():
        header = _GPU_HEADER.match(line)
        if header:
            close()
            current = {"bus_id": header.group(1)}
            continue
        count = _ATTACHED.match(line)
        if count:
            attached = int(count.group(1))
            continue
        field = _FIELD.match(line)
        # The first occurrence wins: "Product Name" and friends are unique per GPU,
        # and ClusterUUID appears once, under Fabric.
        if field and current is not None and field.group(1) not in current:
            current[field.group(1)] = field.group(2)
    close()
    return Listing(gpus=tuple(gpus), attached=attached)


def _is_real_uuid(value: str | None) -> bool:
    if value is None or not value.strip() or value.strip().upper() == "N/A":
        return False
    digits = value.replace("-", "").strip()
    return bool(digits) and set(digits) != {"0"} and not any(c.isspace() for c in digits)


def fabric(listing: Listing) -> Fabric:
    """Valid only if every GPU shows the same ClusterUUID, present, not N/A, not zeros."""
    gpus = listing.gpus
    if not gpus:
        return Fabric(None, "nvidia-smi -q listed no GPUs")
    if listing.attached is not None and listing.attached != len(gpus):
        return Fabric(
            None,
            f"nvidia-smi reports {listing.attached} GPUs but {len(gpus)} could be read; "
            "its output format may have changed",
            gpus,
        )
    missing = [g.bus_id for g in gpus if g.cluster_uuid is None]
    if missing:
        return Fabric(
            None, f"no ClusterUUID line for GPU {', '.join(missing)} (driver too old?)", gpus
        )
    unset = [g for g in gpus if not _is_real_uuid(g.cluster_uuid)]
    if unset:
        shown = sorted({g.cluster_uuid or "" for g in unset})
        return Fabric(
            None,
            f"ClusterUUID is {' / '.join(shown)} on {len(unset)} of {len(gpus)} GPUs: "
            "not in an NVLink domain (no fabric, or fabric manager not ready)",
            gpus,
        )
    distinct = sorted({g.cluster_uuid for g in gpus if g.cluster_uuid})
    if len(distinct) > 1:
        return Fabric(
            None,
            f"GPUs disagree on their ClusterUUID ({', '.join(distinct)}): "
            "this node spans NVLink domains",
            gpus,
        )
    return Fabric(distinct[0], f"all {len(gpus)} GPUs report ClusterUUID {distinct[0]}", gpus)


def unavailable(reason: str) -> Fabric:
    """nvidia-smi missing, failing or hanging: no ClusterUUID, for the reason given."""
    return Fabric(None, reason)


class SegmentError(ValueError):
    """The manifest asks for a segment mode this node cannot run."""


@dataclass(frozen=True)
class SegmentDecision:
    segment: int | None  # the --ft-segment value; None: simple hot-spare mode
    reason: str


def decide(setting: str, task0: Fabric) -> SegmentDecision:
    """Task 0's decision from the manifest's segment setting (auto, off, or N)."""
    if setting == "off":
        return SegmentDecision(None, "segment off in the manifest: simple hot-spare mode")
    if setting == "auto":
        if task0.valid:
            return SegmentDecision(
                1, f"auto: task 0 has ClusterUUID {task0.cluster_uuid}, segment mode with 1"
            )
        return SegmentDecision(None, f"auto: task 0 has no ClusterUUID ({task0.reason})")
    wanted = int(setting)
    if not task0.valid:
        raise SegmentError(
            f"the manifest asks for --ft-segment {wanted}, but this node has no ClusterUUID "
            f"({task0.reason}); NVRx would fail every rendezvous. Resubmit with "
            "--segment auto (or off) on hardware without an NVLink domain"
        )
    return SegmentDecision(wanted, f"segment {wanted} from the manifest")


def disagreement(decision_segment: int | None, here: Fabric) -> str | None:
    """Why this node cannot join task 0's decision, or None.

    Only one direction is fatal: segment mode on a node without a ClusterUUID. A node
    that has one joins a simple hot-spare generation without harm.
    """
    if decision_segment is None or here.valid:
        return None
    return f"task 0 chose --ft-segment {decision_segment} but this node has no ClusterUUID ({here.reason})"
