"""The host tool as a login node gets it: a wheel of the host dependencies only."""

import email.parser
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Runs the real CLI in a Python where `import spython` fails, as on a login node that
# installed the wheel without the apptainer extra.
WITHOUT_SPYTHON = (
    "import sys; sys.modules['spython'] = None; "
    "from nvrx_appliance.cli.main import main; sys.argv[0] = 'nvrx-appliance'; main()"
)


def _cli_without_spython(tmp_path, *args):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_CONF": str(tmp_path / "none")}
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_SPYTHON, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


def test_submit_dry_run_works_without_spython(tmp_path):
    done = _cli_without_spython(
        tmp_path, "submit", "--dry-run", "--work-dir", "/shared/alice/run", "--workload", "cpu"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# dry run: nothing was written or submitted")


def test_an_apptainer_build_without_spython_names_the_extra_to_install(tmp_path):
    done = _cli_without_spython(tmp_path, "image", "build", "--builder", "apptainer")
    assert done.returncode == 2
    assert "pip install 'nvrx-appliance[apptainer]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_make_dist_builds_a_wheel_that_needs_only_the_host_dependencies(tmp_path):
    subprocess.run(
        ["make", "-s", "dist", f"DIST={tmp_path}"], cwd=REPO, check=True, capture_output=True
    )
    (wheel,) = tmp_path.glob("nvrx_appliance-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = email.parser.Parser().parsestr(archive.read(meta_name).decode())
    always = sorted(r.split(">")[0] for r in meta.get_all("Requires-Dist") if "extra ==" not in r)
    assert always == ["click", "rich", "tomli"]
    assert 'spython>=0.3; extra == "apptainer"' in meta.get_all("Requires-Dist")
    # What a submit renders and the image build reads travels inside the wheel.
    for data in ("chain/generation.sbatch.tmpl", "image/install.sh", "image/pins.toml", "py.typed"):
        assert f"nvrx_appliance/{data}" in names
