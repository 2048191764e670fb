"""The ordinary ends of a generation, decided at submit: the time-limit margin Slurm signals
at, and the length after which a chain is done."""

import pytest

from nvrx_appliance.settings import generation_end
from nvrx_appliance.settings.chain import DEFAULT_TRAIN_SAMPLES, ChainSpec


def spec(**settings) -> ChainSpec:
    return ChainSpec(work_dir="/shared/run", **settings)


@pytest.mark.parametrize(
    ("time_limit", "checkpointing", "margin"),
    [
        ("04:00:00", 600, 600),  # the checkpointing timeout: the slowest save it allows fits
        ("01:00:00", 600, 600),
        ("00:20:00", 600, 300),  # at most a quarter of the generation
        ("1", 60, 15),  # --time 1 (one minute), as the cluster tests run
        ("1-00:00:00", 1800, 1800),
    ],
)
def test_the_auto_margin_fits_a_save_and_leaves_most_of_the_generation(
    time_limit, checkpointing, margin
):
    s = spec(time_limit=time_limit, checkpointing_timeout=checkpointing)
    assert generation_end.margin_s(s) == margin
    assert generation_end.sbatch_signal(s) == f"--signal=B:URG@{margin}"


def test_off_and_no_time_limit_ask_slurm_for_nothing():
    assert generation_end.sbatch_signal(spec(time_limit_margin="off")) is None
    assert generation_end.sbatch_signal(spec(time_limit="0")) is None  # no limit to save before


def test_an_explicit_margin_is_taken_as_given():
    assert generation_end.sbatch_signal(spec(time_limit_margin="90")) == "--signal=B:URG@90"


@pytest.mark.parametrize(
    ("margin", "time_limit", "says"),
    [
        ("soon", "01:00:00", "is not auto, off, or a number of seconds"),
        ("0", "01:00:00", "is not auto, off, or a number of seconds"),
        ("70000", "3-00:00:00", "1-65535"),
        ("1900", "01:00:00", "leaves less than half of --time 01:00:00 (3600 s) to train"),
    ],
)
def test_a_margin_that_cannot_work_is_refused_naming_the_option(margin, time_limit, says):
    [problem] = generation_end.problems(spec(time_limit_margin=margin, time_limit=time_limit))
    assert problem.option == "--time-limit-margin" and says in problem.message


def test_a_margin_shorter_than_a_save_may_take_is_said_not_refused():
    s = spec(time_limit="1", checkpointing_timeout=60)
    assert generation_end.problems(s) == []
    [warning] = generation_end.warnings(s)
    assert "15 s before the time limit is less than --checkpointing-timeout (60 s)" in warning
    assert generation_end.warnings(spec()) == []  # the defaults: 600 s of 01:00:00


def test_the_length_is_in_the_unit_the_user_gave():
    assert generation_end.length(spec(workload="cpu", train_samples=800)) == ("samples", 800)
    assert generation_end.length(spec(workload="cpu")) == ("samples", DEFAULT_TRAIN_SAMPLES)
    args = ["--num-layers", "2", "--train-iters", "500"]
    assert generation_end.length(spec(megatron_args=args)) == ("iterations", 500)
    assert (
        generation_end.length(spec(workload="script", script="/s.py")) is None
    )  # the script's own


def test_megatron_ends_where_its_own_arithmetic_says():
    # update_train_iters at the pin: train_samples // global_batch_size for a constant batch
    assert generation_end.megatron_final_iteration(spec(train_samples=1000), global_batch=16) == 62
    iters = spec(megatron_args=["--train-iters", "300"])
    assert generation_end.megatron_final_iteration(iters, global_batch=16) == 300
    ramp = spec(train_samples=1000, megatron_args=["--rampup-batch-size", "4", "4", "100"])
    assert generation_end.megatron_final_iteration(ramp, global_batch=16) is None


def test_a_chain_that_completed_is_resubmitted_only_to_train_longer():
    old = spec(workload="cpu", train_samples=1600)
    assert (
        generation_end.resubmit_problem(old, spec(workload="cpu", train_samples=3200), 200) is None
    )
    same = generation_end.resubmit_problem(old, spec(workload="cpu", train_samples=1600), 200)
    assert same is not None and "completed at iteration 200" in same
    assert "Raise --train-samples" in same and "--force" in same
    script = spec(workload="script", script="/s.py")
    assert "--force" in (generation_end.resubmit_problem(script, script, 200) or "")
