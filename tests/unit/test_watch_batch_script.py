"""A chain not submitted by nvrx-appliance: its cycle-info directory and checkpoint tracker
are found in its batch script, statically, following its variables and includes."""

from __future__ import annotations

from pathlib import Path

from nvrx_appliance.watch import batch_script as script
from nvrx_appliance.watch import readers

KNOWN = {"SLURM_JOB_NAME": "llm", "SLURM_SUBMIT_DIR": "/home/alice/sub", "USER": "alice"}


def resolve(path: Path, cwd: str = "/home/alice/sub") -> script.ScriptPaths:
    return script.resolve(str(path), path.read_text(), readers.read_script, KNOWN, cwd)


def test_paths_built_from_the_scripts_own_variables_and_defaults(tmp_path):
    sbatch = tmp_path / "job.sbatch"
    sbatch.write_text(
        "#!/bin/bash\n"
        "#SBATCH --job-name=llm\n"
        'RUN_ROOT="${RUN_ROOT:-/lustre/alice/llm}"   # overridable\n'
        "CKPT=$RUN_ROOT/checkpoints\n"
        "NVRX_JOB_DIR=${RUN_ROOT}/nvrx/${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID}}\n"
        'ARGS=" \\\n'
        "  --ft-cycle-info-dir=${NVRX_JOB_DIR}/cycle_infos \\\n"
        '  --ft-checkpoint-iteration-file ${CKPT}/latest_checkpointed_iteration.txt "\n'
        'srun sh -c "ft_launcher $ARGS train.py"\n'
    )
    found = resolve(sbatch)
    # The generation's id is only known at run time: it becomes a glob over generations.
    assert found.cycle_info_dir == "/lustre/alice/llm/nvrx/*/cycle_infos"
    assert found.tracker == "/lustre/alice/llm/checkpoints/latest_checkpointed_iteration.txt"
    assert found.unresolved == ()


def test_includes_located_relative_to_the_script_are_followed(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "cells").mkdir()
    (tmp_path / "lib" / "common.sh").write_text(
        'ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"\n'
        ': "${RUNS:=$ROOT/runs}"\n'
        "FT_ARGS=(\n"
        '  --ft-cycle-info-dir "$RUNS/$SLURM_JOB_NAME/nvrx/$SLURM_ARRAY_JOB_ID/cycle_infos"\n'
        "  --ft-checkpoint-iteration-file=$RUNS/$SLURM_JOB_NAME/ckpt/iter.txt  # progress\n"
        ")\n"
    )
    sbatch = tmp_path / "cells" / "llm.sbatch"
    sbatch.write_text(
        'HERE=$(dirname "$0")\n. "$HERE/../lib/common.sh"\nsrun ft_launcher "${FT_ARGS[@]}" x.py\n'
    )
    found = resolve(sbatch)
    assert found.cycle_info_dir == f"{tmp_path}/runs/llm/nvrx/*/cycle_infos"
    assert found.tracker == f"{tmp_path}/runs/llm/ckpt/iter.txt"
    assert found.files_read == (str(sbatch), str(tmp_path / "lib" / "common.sh"))


def test_a_relative_source_is_looked_up_from_the_jobs_working_directory(tmp_path):
    (tmp_path / "env.sh").write_text("export WORK=/scratch/alice/w\n")
    sbatch = tmp_path / "job.sbatch"
    sbatch.write_text("source env.sh\nft_launcher --ft-cycle-info-dir $WORK/ci x.py\n")
    assert resolve(sbatch, cwd=str(tmp_path)).cycle_info_dir == "/scratch/alice/w/ci"


def test_pwd_and_cd_resolve_against_the_jobs_working_directory(tmp_path):
    sbatch = tmp_path / "job.sbatch"
    sbatch.write_text(
        'W="${NVRX_WORK_DIR:-${PWD}/nvrx-run}"\ncd sub\nft_launcher --ft-cycle-info-dir "$(pwd)/ci" --ft-checkpoint-iteration-file "$W/t.txt"\n'
    )
    found = resolve(sbatch, cwd="/home/alice/sub")
    assert found.cycle_info_dir == "/home/alice/sub/sub/ci"
    assert found.tracker == "/home/alice/sub/nvrx-run/t.txt"


def test_an_unknown_variable_leaves_the_path_unresolved_and_says_which(tmp_path):
    sbatch = tmp_path / "job.sbatch"
    sbatch.write_text("ft_launcher --ft-cycle-info-dir $SITE_SCRATCH/ci x.py\n")
    found = resolve(sbatch)
    assert found.cycle_info_dir is None
    assert found.unresolved == ("--ft-cycle-info-dir <$SITE_SCRATCH: unknown>/ci",)


def test_nothing_in_the_script_is_ever_executed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("still here")
    marker = tmp_path / "ran"
    sbatch = tmp_path / "job.sbatch"
    sbatch.write_text(
        f"rm -f {victim}\n"
        f"touch {marker}\n"
        f'D="$(touch {marker}; echo /x)"\n'
        f"source <(touch {marker})\n"
        'ft_launcher --ft-cycle-info-dir "$D/ci" x.py\n'
    )
    found = resolve(sbatch)
    assert victim.read_text() == "still here" and not marker.exists()
    assert found.cycle_info_dir is None  # a command substitution it cannot evaluate
    assert found.unresolved and "unknown" in found.unresolved[0]


def test_an_include_cycle_ends(tmp_path):
    (tmp_path / "a.sh").write_text(f"source {tmp_path}/b.sh\nX=/a\n")
    (tmp_path / "b.sh").write_text(f"source {tmp_path}/a.sh\n")
    sbatch = tmp_path / "job.sbatch"
    sbatch.write_text(f"source {tmp_path}/a.sh\nft_launcher --ft-cycle-info-dir $X/ci\n")
    assert resolve(sbatch).cycle_info_dir == "/a/ci"


def test_single_quotes_stay_literal_and_later_assignments_win(tmp_path):
    sbatch = tmp_path / "job.sbatch"
    sbatch.write_text(
        "A=/first\nA=/second\n"
        "ft_launcher --ft-cycle-info-dir \"$A/ci\" --ft-checkpoint-iteration-file '$A/t'\n"
    )
    found = resolve(sbatch)
    assert found.cycle_info_dir == "/second/ci"
    assert found.tracker == "$A/t"


def test_what_a_script_asks_scontrol_about_itself_is_answered_from_the_job(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "env.sh").write_text("CI_ROOT=$SUBMITTED/nvrx\n")
    sbatch = tmp_path / "job.sbatch"
    sbatch.write_text(
        "LIB=$(scontrol -o show job ${SLURM_JOBID} | grep -oP 'Command=\\K\\S+' | xargs dirname)/lib\n"
        "SUBMITTED=$(scontrol show job $SLURM_JOB_ID | awk -F= '/WorkDir=/{print $2}' | head -n1)\n"
        'source "$LIB/env.sh"\n'
        'ft_launcher --ft-cycle-info-dir "$CI_ROOT/ci" x.py\n'
    )
    job = {"Command": str(sbatch), "WorkDir": "/lustre/alice/exp"}
    found = script.resolve(
        str(sbatch), sbatch.read_text(), readers.read_script, KNOWN, "/home/alice/sub", job
    )
    assert found.cycle_info_dir == "/lustre/alice/exp/nvrx/ci"
    assert found.files_read == (str(sbatch), str(tmp_path / "lib" / "env.sh"))


def test_scontrol_about_another_job_or_an_unknown_command_stays_unknown(tmp_path):
    sbatch = tmp_path / "job.sbatch"
    sbatch.write_text(
        "D=$(dirname $(scontrol show job 1234 | awk -F= '/Command=/{print $2}'))\n"
        "E=$(dirname $(scontrol show job $SLURM_JOB_ID | awk -F= '/Command=/{print $2}'))\n"
        "ft_launcher --ft-cycle-info-dir $D/ci --ft-checkpoint-iteration-file $E/t.txt x.py\n"
    )
    found = script.resolve(str(sbatch), sbatch.read_text(), readers.read_script, KNOWN, "/s", {})
    assert (found.cycle_info_dir, found.tracker) == (None, None)
    assert [u.split()[0] for u in found.unresolved] == [
        "--ft-cycle-info-dir",
        "--ft-checkpoint-iteration-file",
    ]
