"""An image's qualification status: does a record vouch for it on this cluster? Pure.

submit looks up the record next to the image (`<image>.qualification.json`), asks
assess() for the status, records it in run.json under the image's manifest and says
it once: one line when a passed record vouches for the image's combination here, one
marked warning block otherwise. It never refuses: NVRx's Megatron-LM guide asks for
recovery checks before *relying* on a combination, and a first run is how one finds out.
status reads it back from run.json.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nvrx_appliance.image import qualification as q

KEY = "qualification"  # where the status sits in run.json's image dict
PASSED, FAILED, NONE = "passed", "failed", "none"
UNKNOWN_CLUSTER = "unknown"  # what qualify records when Slurm did not say its name
RULE = "=" * 78
# (label, key in the probed versions): what a person checks against NVRx's guide.
_VERSIONS = (
    ("NVRx", "nvrx"),
    ("Megatron-LM", "megatron_commit"),
    ("PyTorch", "pytorch"),
    ("CUDA", "cuda"),
    ("NCCL", "nccl"),
    ("Transformer Engine", "transformer_engine"),
    ("Python", "python"),
)


@dataclass(frozen=True)
class QualificationStatus:
    status: str  # passed | failed | none
    record: str  # where the record was looked for
    date: str = ""  # when the qualify run that wrote the record finished
    cluster: str = ""  # the cluster it ran on
    why: str = ""  # for failed and none: what a person should know

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def versions(manifest: dict[str, Any]) -> dict[str, str]:
    """The probed versions by label; a Megatron-LM commit is shortened the way git does."""
    probed = manifest.get("probed") or {}
    found = {label: str(probed.get(key, "unknown")) for label, key in _VERSIONS}
    commit = found["Megatron-LM"]
    if len(commit) == 40:
        found["Megatron-LM"] = commit[:7]
    return found


def label(manifest: dict[str, Any]) -> str:
    return ", ".join(f"{name} {value}" for name, value in versions(manifest).items())


def _cluster_of(record: dict[str, Any]) -> str:
    cluster = record.get("cluster")
    name = cluster.get("cluster_name") if isinstance(cluster, dict) else None
    return str(name or UNKNOWN_CLUSTER)


def _first_failure(record: dict[str, Any]) -> str:
    found = record.get("checks")
    checks = found if isinstance(found, list) else []
    failed = [c for c in checks if isinstance(c, dict) and c.get("passed") is False]
    if not failed:
        return f"result {record.get('result')!r}"
    return f"{failed[0].get('name')}: {failed[0].get('detail')}"


def assess(
    manifest: dict[str, Any], record: Any, *, record_path: str, cluster: str
) -> QualificationStatus:
    """The qualification status of an image with this manifest, given the record found next to it
    (None when there is none) and the name of the cluster submitting ("" if unknown)."""
    if not isinstance(record, dict) or record.get("schema") != q.SCHEMA:
        return QualificationStatus(NONE, record_path, why=f"none at {record_path}")
    date, where = str(record.get("finished") or record.get("started") or "?"), _cluster_of(record)
    if record.get("combination") != q.combination(manifest):
        # The same file name rebuilt with other versions: the record vouches for the old one.
        return QualificationStatus(
            NONE,
            record_path,
            date,
            where,
            f"the record at {record_path} is for another combination: "
            f"{label(record.get('image_manifest') or {})}",
        )
    if cluster and UNKNOWN_CLUSTER not in (cluster, where) and cluster != where:
        return QualificationStatus(
            NONE, record_path, date, where, f"it was qualified on cluster {where}, not on {cluster}"
        )
    if not q.matches(record, manifest):
        return QualificationStatus(FAILED, record_path, date, where, _first_failure(record))
    return QualificationStatus(PASSED, record_path, date, where)


def message(image: str, manifest: dict[str, Any], found: QualificationStatus) -> str:
    """What submit says about the image: one line, or one warning block between rules."""
    name = Path(image).name
    if found.status == PASSED:
        return (
            f"image {name}: qualified on {found.date} on cluster {found.cluster} "
            f"(record {found.record})"
        )
    if found.status == FAILED:
        verdict = (
            f"FAILED its qualification on {found.date} on cluster {found.cluster} ({found.why})"
        )
    else:
        verdict = f"has no qualification record on this cluster ({found.why})"
    return "\n".join(
        (
            RULE,
            f"WARNING: image {name} ({label(manifest)}) {verdict}.",
            f"Run `nvrx-appliance qualify --image {image} [your submit options]` before "
            "relying on it:",
            "NVRx's Megatron-LM guide asks for the recovery checks run for real; a dry run "
            "is not evidence of recovery.",
            RULE,
        )
    )


def image_manifest(run_image: dict[str, Any]) -> dict[str, Any]:
    """The image's own manifest out of run.json's image dict (without the qualification status)."""
    return {key: value for key, value in run_image.items() if key != KEY}
