"""Shared makers for the entrypoint tests (no tests here)."""

from pathlib import Path

from nvrx_appliance import manifest
from nvrx_appliance.node import control
from nvrx_appliance.settings.chain import ChainSpec

CHAIN = "2026-01-01T00:00:00Z"  # the chain id run_manifest gives


def run_manifest(work_dir: Path, **settings) -> manifest.Manifest:
    spec = ChainSpec(work_dir=str(work_dir), **settings)
    return manifest.build(spec, created=CHAIN, user="alice")


def record(**changes) -> control.Record:
    """Task 0's record for array job 4242 on node1, with `changes` applied; of the
    generation run_manifest's chain and that array job make."""
    fields = (
        dict(
            host="node1",
            port=29500,
            segment=None,
            cluster_uuid=None,
            started="2026-01-01T00:00:01+00:00",
            array_job_id="4242",
            task_id=0,
            job_id="4242",
        )
        | changes
    )
    fields.setdefault("generation", control.generation(CHAIN, fields["array_job_id"]))
    return control.Record(**fields)
