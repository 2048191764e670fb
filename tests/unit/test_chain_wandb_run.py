"""One W&B run per chain: an id decided at submit, recorded in run.json, and given to
every rank of every generation and in-job restart through the variables W&B reads
(WANDB_RUN_ID, WANDB_RESUME=allow); a chain resubmitted into the same work dir, whose
checkpoints it continues, continues the same run."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

from nvrx_appliance import manifest
from nvrx_appliance.chain import probe
from nvrx_appliance.chain import submit as submitting
from nvrx_appliance.node import env
from nvrx_appliance.node.identity import Node
from nvrx_appliance.settings.chain import ChainSpec, spec_fields
from nvrx_appliance.settings.resolve import Resolved
from nvrx_appliance.settings.validate import Facts
from tests.unit.test_entrypoint_main import ENTRYPOINT, srun_stand_in

LOGGING = [
    "--num-layers", "4", "--wandb-project", "gpt-1b5", "--wandb-exp-name", "baseline",
    "--wandb-save-dir", "/lustre/wandb/gpt-1b5",
]  # fmt: skip
NODE = Node(array_job_id="901", task_id=0, node_id=0, job_id="901", hostname="node1")


def spec(work_dir: Path, **settings) -> ChainSpec:
    settings = {"megatron_args": LOGGING, "train_samples": 1000, "job_name": "gpt-1b5"} | settings
    return ChainSpec(work_dir=str(work_dir), workload="megatron", **settings)


def test_a_chain_that_logs_to_wandb_gets_one_run_id_recorded_in_run_json(tmp_path):
    m = manifest.build(spec(tmp_path), created="2026-12-01T08:30:00Z", user="alice")
    assert m.wandb_run_id == "gpt-1b5-20261201083000"
    saved = json.loads(manifest.save(m).read_text())
    assert saved["wandb"] == {"run_id": "gpt-1b5-20261201083000"}
    assert manifest.load(m.layout.run_json).wandb_run_id == m.wandb_run_id


def test_a_chain_without_wandb_records_no_run_and_sets_no_variable(tmp_path):
    m = manifest.build(spec(tmp_path, megatron_args=["--num-layers", "4"]),
                       created="2026-12-01T08:30:00Z", user="alice")  # fmt: skip
    assert m.wandb_run_id == "" and m.to_json()["wandb"] is None
    assert "WANDB_RUN_ID" not in env.plan(m, NODE, {}).set


def test_every_rank_is_told_the_chains_run_and_to_resume_it(tmp_path):
    m = manifest.build(spec(tmp_path), created="2026-12-01T08:30:00Z", user="alice")
    told = env.plan(m, NODE, {"WANDB_RUN_ID": "left-over-from-the-login-node"}).set
    assert (told["WANDB_RUN_ID"], told["WANDB_RESUME"]) == (m.wandb_run_id, "allow")


def test_the_entrypoint_gives_the_workload_the_run_from_run_json(tmp_path):
    m = manifest.build(spec(tmp_path / "work"), created="2026-12-01T08:30:00Z", user="alice")
    run_json = manifest.save(m)
    result = subprocess.run(
        [*ENTRYPOINT, "--manifest", str(run_json), "--dry-run", "--json"],
        env=srun_stand_in(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    told = json.loads(result.stdout)["env"]["set"]
    assert (told["WANDB_RUN_ID"], told["WANDB_RESUME"]) == ("gpt-1b5-20261201083000", "allow")


def test_a_chain_resubmitted_into_its_work_dir_continues_the_recorded_run(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    first = manifest.build(spec(work), created="2026-11-30T00:00:00Z", user="alice")
    manifest.save(first)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none.conf"))  # Slurm unreachable

    def gather(s: ChainSpec, **kwargs) -> Facts:
        # The real probe, but the test's /tmp work dir counted as shared storage.
        return dataclasses.replace(probe.gather(s, **kwargs), work_dir_real="/lustre/work")

    def prepare(s: ChainSpec) -> submitting.Plan:
        resolved = Resolved(s, {f.name: "default" for f in spec_fields()})
        return submitting.plan(resolved, dry_run=True, force=False, user="alice", gather=gather)

    assert prepare(spec(work)).manifest.wandb_run_id == first.wandb_run_id
    assert first.wandb_run_id == "gpt-1b5-20261130000000"
    elsewhere = prepare(spec(tmp_path / "other")).manifest.wandb_run_id
    assert elsewhere not in ("", first.wandb_run_id)
