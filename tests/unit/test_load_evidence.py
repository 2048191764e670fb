"""When a worker's exit is a checkpoint that could not be loaded, and when it is not
(issue 40): recorded lines of the pinned Megatron (megatron/training/checkpointing.py at
5d4cf1d: its loading lines are print_rank_0, so rank 0's only) and of torch."""

from nvrx_appliance.rank import workload_exit

CKPT = "/lustre/run/checkpoints"
LOADING = f" loading distributed checkpoint from {CKPT} at iteration 200"
LOADED = (
    f"  successfully loaded checkpoint from {CKPT} [ t 1/1, gtp_remat 1/1, p 1/1 ] at iteration 200"
)
SAVING = (
    f"[2026-12-04 09:12:01.123456] saving checkpoint at iteration     300 to {CKPT} in "
    "torch_dist format"
)
# torch.distributed.checkpoint's error when a save fails (a full quota), on rank 3.
SAVE_FAILED = [
    "Traceback (most recent call last):",
    '  File "/workspace/megatron-lm/megatron/training/checkpointing.py", line 780, in save_checkpoint',
    "torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([3])",
    f"OSError: [Errno 122] Disk quota exceeded: '{CKPT}/iter_0000300/__3_0.distcp'",
]
# A data loader reading a truncated shard, on rank 7.
DATA_ERROR = [
    "Traceback (most recent call last):",
    '  File "/workspace/data/indexed_dataset.py", line 412, in __getitem__',
    "    sample = pickle.load(fh)",
    "EOFError: Ran out of input",
]


def judged(lines, *, rank0, code=1, tracked=200):
    seen = workload_exit.judge(code, {}, "megatron", lines, rank0=rank0, tracked=tracked)
    assert seen is not None
    return seen.load_failure


def test_a_save_that_fails_on_another_rank_is_no_failed_load():
    # Reproduced: rank 3's failed save of 300 set the good 200 aside.
    assert judged(SAVE_FAILED, rank0=False) is None
    # Rank 0 of the same cycle: loaded 200, trained, saving 300 when it failed.
    assert judged([LOADING, LOADED, SAVING, *SAVE_FAILED], rank0=True) is None
    # Rank 0 with its loaded line pushed out: the save line still ends the load.
    assert judged([LOADING, SAVING, *SAVE_FAILED], rank0=True) is None


def test_a_data_error_on_another_rank_is_never_a_failed_load():
    # Reproduced: rank 7's "EOFError: Ran out of input" in three cycles set 200, then 100
    # aside, then stopped the chain on "checkpoint 50 cannot be loaded".
    assert judged(DATA_ERROR, rank0=False) is None
    assert judged([LOADING, *DATA_ERROR], rank0=False) is None  # not its line to print


def test_a_crash_after_training_past_the_loaded_checkpoint_is_no_failed_load():
    trained = [LOADING, " iteration      201/    1000 | consumed samples: 1608 |", *DATA_ERROR]
    assert judged(trained, rank0=True) is None
    script = ["loading checkpoint from /w at iteration 40", "iteration 45/300 | loss 1.0",
              *DATA_ERROR]  # fmt: skip
    assert judged(script, rank0=True, tracked=40) is None


def test_a_read_error_inside_rank_0s_loading_window_is_a_failed_load():
    failed = judged([LOADING, "RuntimeError: PytorchStreamReader failed reading zip archive: "
                     "failed finding central directory"], rank0=True)  # fmt: skip
    assert failed is not None and failed.iteration == 200
    eof = judged([LOADING, *DATA_ERROR], rank0=True)  # torn pickle while loading
    assert eof is not None and eof.iteration == 200 and "Ran out of input" in eof.line


def test_a_checkpoint_missing_whole_or_without_metadata_is_a_failed_load():
    # Raised by _get_checkpoint_format on every rank, before the loading line.
    unknown = [f"NotImplementedError: unknown checkpoint format in {CKPT}/iter_0000200"]
    found = judged(unknown, rank0=True)
    assert found is not None and found.iteration == 200
    missing = [f"FileNotFoundError: [Errno 2] No such file or directory: '{CKPT}/iter_0000200'"]
    found = judged(missing, rank0=True)
    assert found is not None and found.iteration == 200
    # Another checkpoint's directory, or a data file: not this load.
    assert judged([missing[0].replace("0000200", "0000300")], rank0=True) is None
    assert judged(["FileNotFoundError: [Errno 2] No such file: '/data/shard_7.bin'"],
                  rank0=True) is None  # fmt: skip


def test_the_contract_line_counts_on_any_rank():
    line = f"{workload_exit.LOAD_FAILED_MARK} iteration=40"
    found = judged(["hello", line], rank0=False, tracked=40)
    assert found == workload_exit.LoadFailure(40, line)


def test_a_line_without_the_word_checkpoint_is_no_load_line():
    assert not workload_exit.is_load_line(" iteration      201/    1000 | lm loss: 2.0 |" * 20)
    assert workload_exit.is_load_line(LOADING) and workload_exit.is_load_line(SAVING)
