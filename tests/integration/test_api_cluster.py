"""A chain driven through the Python API alone (nvrx_appliance.api): built, submitted,
followed, read and cancelled on the local cluster, with no CLI in between."""

from __future__ import annotations

import pytest

from nvrx_appliance import api
from nvrx_appliance.devcluster.poll import wait_until
from nvrx_appliance.workflows.demo import QUICK

from .chain_support import logs_on_failure, unique
from .conftest import Cluster

pytestmark = pytest.mark.cluster


def test_a_chain_built_submitted_followed_read_and_cancelled_through_the_api(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
):
    for key, value in cluster.slurm_env.items():
        monkeypatch.setenv(key, value)
    work = cluster.workdir("api")
    # No NVRX_* variable of the machine may leak in: environ={} resolves keywords only.
    spec = api.chain_spec(
        environ={}, **{**QUICK, "work_dir": str(work), "job_name": unique("api"),
                       "train_tasks": 1, "hot_spares": 0, "depth": 2, "train_samples": 100000},
    )  # fmt: skip
    chain = api.submit(spec)
    try:
        assert len(chain.job_ids) == 2 and chain.work_dir == work
        first = chain.job_ids[0]

        def checkpointed() -> api.ChainView | None:
            view = api.status(first)  # a job id finds the chain as well as the Chain does
            return view if view.checkpoint_now else None

        view = wait_until(checkpointed, 180, "the first generation's first checkpoint", 1.0)
        assert view.job_name == spec.job_name and view.mode == "train"
        assert view.generations[0].array_job_id == first
        assert view.generations[0].state == "running"
        assert view.queued == (chain.job_ids[1],)

        batch = api.logs(chain)
        assert batch.generation == first and batch.path.exists()
        assert batch.text.strip()
        launcher = api.logs(spec.job_name, launcher=True)
        assert launcher.generation == first
        # ft_launcher creates its log before it writes to it: wait for its first line.
        wait_until(lambda: launcher.text.strip(), 60, "ft_launcher's first log line", 0.5)

        done = api.cancel(chain)
        assert done.running == (first,) and done.queued == (chain.job_ids[1],)

        def ended() -> api.ChainView | None:
            now = api.status(chain)
            return now if all(g.state == "ended" for g in now.generations) else None

        final = wait_until(ended, 120, "every generation of the cancelled chain to end", 1.0)
        assert [g.array_job_id for g in final.generations][:1] == [first]
    except BaseException:
        print(logs_on_failure(work))
        api.cancel(chain)
        raise
