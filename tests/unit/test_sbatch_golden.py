"""The rendered sbatch, whole, for a few representative chains (golden_sbatch.py)."""

import pytest

from tests.unit import golden_sbatch


@pytest.mark.parametrize("name", sorted(golden_sbatch.CASES))
def test_the_rendered_sbatch_is_the_recorded_one(name):
    path = golden_sbatch.recorded_path(name)
    assert path.exists(), f"{path} is missing: run `make golden-sbatch` and review it"
    assert golden_sbatch.rendered(name) == path.read_text(), (
        f"the {name} sbatch changed: if that is intended, run `make golden-sbatch` and "
        "review the diff of tests/unit/fixtures/sbatch/"
    )


@pytest.mark.parametrize("name", sorted(golden_sbatch.CASES))
def test_the_rendered_sbatch_stays_thin(name):
    # What must be bash and no more (docs/batch-script.md): the rest is run.json's and the
    # host code's (nvrx_appliance/jobhost/).
    assert len(golden_sbatch.rendered(name).splitlines()) <= 200
