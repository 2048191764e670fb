"""The hang rule on recorded stacks (py-spy 0.4.3's frames of the built-in trainer's ranks:
a rank waiting in gloo's all_reduce, a rank frozen in its own step, a checkpoint save).

A hang on one node names it; a hang on every rank, a save on every rank, ranks still
moving, or outliers on two nodes name nobody."""

from __future__ import annotations

from nvrx_appliance.rank import hang_rule
from nvrx_appliance.rank.hang_rule import Frame, RankStack

NOW = 1_000_000.0
STILL_S = 10.0
FRESH_S = 15.0

# As py-spy read them (short file names, innermost first).
WAITING = (
    Frame("all_reduce", "torch/distributed/distributed_c10d.py", 3252),
    Frame("_exception_logger.<locals>.wrapper", "torch/distributed/c10d_logger.py", 83),
    Frame("_train_step", "nvrx_appliance/workloads/trainer.py", 233),
    Frame("_train", "nvrx_appliance/workloads/trainer.py", 178),
    Frame("run", "nvrx_appliance/workloads/trainer.py", 85),
    Frame("<module>", "nvrx_appliance/workloads/cpu.py", 148),
)
FROZEN = (
    Frame("_train_step", "nvrx_appliance/workloads/trainer.py", 226),
    Frame("_train", "nvrx_appliance/workloads/trainer.py", 178),
    Frame("run", "nvrx_appliance/workloads/trainer.py", 85),
    Frame("<module>", "nvrx_appliance/workloads/cpu.py", 148),
)
# A rank of the built-in trainer (DDP) waiting for its peer: gloo's all-reduce of the
# gradients runs inside backward, so only its native frames (py-spy --native of the
# blocked rank) say what it waits for.
DDP_WAITING = (
    Frame("_engine_run_backward", "torch/autograd/graph.py", 979),
    Frame("backward", "torch/autograd/__init__.py", 395),
    Frame("Tensor.backward", "torch/_tensor.py", 623),
    Frame("_train_step", "nvrx_appliance/workloads/trainer.py", 229),
)
DDP_NATIVE = (
    "0x7f107daa3f16",
    "pthread_cond_wait",
    "std::condition_variable::wait",
    "c10d::Work::wait",
    "c10d::Reducer::finalize_backward",
    "torch::autograd::GraphTask::exec_post_processing",
)
FROZEN_IN_TORCH = (
    Frame("Linear.forward", "torch/nn/modules/linear.py", 134),
    Frame("Module._call_impl", "torch/nn/modules/module.py", 1789),
    *FROZEN,
)
SAVING = (
    Frame("barrier", "torch/distributed/distributed_c10d.py", 4821),
    Frame("_exception_logger.<locals>.wrapper", "torch/distributed/c10d_logger.py", 83),
    Frame("save", "nvrx_appliance/workloads/checkpointing.py", 59),
    Frame("_checkpoint", "nvrx_appliance/workloads/trainer.py", 240),
    Frame("_train", "nvrx_appliance/workloads/trainer.py", 192),
)
WRITING = (
    Frame("write_atomic", "nvrx_appliance/files.py", 80),
    Frame("save", "nvrx_appliance/workloads/checkpointing.py", 63),
    Frame("_checkpoint", "nvrx_appliance/workloads/trainer.py", 240),
)


def stack(rank: int, node: str, frames, *, still: float = 60.0, age: float = 1.0, domain=""):
    return RankStack(rank, node, tuple(frames), NOW - age, NOW - still, domain=domain)


def judge(stacks, world_size=None, segment=False):
    return hang_rule.judge(
        stacks, world_size=len(stacks) if world_size is None else world_size, cycle=2,
        now=NOW, fresh_s=FRESH_S, still_s=STILL_S, segment=segment,
    )  # fmt: skip


def three_nodes(sick: str = "node3"):
    """Three nodes of two ranks each; the ranks of `sick` frozen in their step."""
    nodes = ["node1", "node1", "node2", "node2", "node3", "node3"]
    return [stack(r, n, FROZEN if n == sick else WAITING) for r, n in enumerate(nodes)]


def test_a_hang_on_one_node_names_that_node_in_words():
    found = judge(three_nodes())
    assert found.nodes == ("node3",)
    assert found.words == (
        "node3 hung in cycle 2: its 2 ranks stopped in `_train_step` while the 4 others "
        "waited in `all_reduce`"
    )
    waiting, stopped = found.groups
    assert (waiting.where, waiting.waiting, waiting.ranks) == ("all_reduce", True, (0, 1, 2, 3))
    assert (stopped.where, stopped.waiting, stopped.nodes) == ("_train_step", False, ("node3",))


def test_two_nodes_of_one_rank_each_name_the_one_that_does_not_wait():
    found = judge([stack(0, "node1", WAITING), stack(1, "node2", FROZEN)])
    assert found.nodes == ("node2",)


def test_a_hang_on_every_rank_names_no_node():
    found = judge([stack(r, f"node{r // 2 + 1}", FROZEN) for r in range(6)])
    assert not found.verdict
    assert "every rank stopped in its own code" in found.words


def test_every_rank_waiting_in_a_collective_names_no_node():
    found = judge([stack(r, f"node{r // 2 + 1}", WAITING) for r in range(6)])
    assert not found.verdict and "NCCL's flight recorder" in found.words


def test_a_checkpoint_save_on_every_rank_names_no_node():
    # Rank 0 writes the tracker while the others wait in the save's barrier.
    stacks = [stack(0, "node1", WRITING)] + [
        stack(r, f"node{r // 2 + 1}", SAVING) for r in (1, 2, 3, 4, 5)
    ]
    found = judge(stacks)
    assert not found.verdict
    assert "checkpoint, the data or the file system" in found.words


def test_a_data_loader_stall_names_no_node():
    loading = (Frame("_next_data", "torch/utils/data/dataloader.py", 700), *FROZEN)
    stacks = three_nodes()
    stacks[4] = stack(4, "node3", loading)
    assert not judge(stacks).verdict


def test_outliers_on_two_nodes_name_no_node():
    stacks = three_nodes()
    stacks[0] = stack(0, "node1", FROZEN)
    found = judge(stacks)
    assert not found.verdict and "no single outlier" in found.words


def test_outliers_in_one_nvlink_domain_are_named_in_segment_mode():
    nodes = ["node1", "node2", "node3", "node4"]
    domains = ["a", "a", "b", "b"]
    stacks = [
        stack(r, n, FROZEN if d == "b" else WAITING, domain=d)
        for r, (n, d) in enumerate(zip(nodes, domains, strict=True))
    ]
    assert judge(stacks, segment=True).nodes == ("node3", "node4")
    assert not judge(stacks, segment=False).verdict  # two nodes outside: not one node


def test_a_missing_or_stale_stack_names_no_node():
    stacks = three_nodes()
    assert "5 of the 6 ranks" in judge(stacks[:5], world_size=6).words
    stacks[1] = stack(1, "node1", WAITING, age=FRESH_S + 1)
    assert "older than" in judge(stacks).words


def test_ranks_that_moved_lately_are_not_hung():
    stacks = three_nodes()
    stacks[5] = stack(5, "node3", FROZEN, still=STILL_S / 2)
    found = judge(stacks)
    assert not found.verdict and "still moving" in found.words


def test_fewer_waiting_than_outliers_names_no_node():
    nodes = ["node1", "node2", "node2", "node2"]
    stacks = [stack(0, "node1", WAITING)] + [stack(r, n, FROZEN) for r, n in enumerate(nodes) if r]
    assert not judge(stacks).verdict


def test_a_rank_waiting_in_ddps_gradient_all_reduce_counts_as_waiting_by_its_native_frames():
    waiting = RankStack(0, "node1", DDP_WAITING, NOW - 1, NOW - 60, native=DDP_NATIVE)
    found = judge([waiting, stack(1, "node2", FROZEN_IN_TORCH)])
    assert found.nodes == ("node2",)
    # The frozen rank's words name the workload's own frame, not PyTorch's.
    assert found.words == (
        "node2 hung in cycle 2: its 1 rank stopped in `_train_step` while the 1 other "
        "waited in `all_reduce`"
    )
    without_native = RankStack(0, "node1", DDP_WAITING, NOW - 1, NOW - 60)
    assert not judge([without_native, stack(1, "node2", FROZEN)]).verdict


def test_a_stopped_rank_inside_a_collective_frame_does_not_count_as_waiting():
    # Every rank frozen at once: node1's two happened to be inside all_reduce's frame.
    stacks = [
        RankStack(r, f"node{r // 2 + 1}", WAITING if r < 2 else FROZEN, NOW - 1, NOW - 60,
                  state="T")
        for r in range(4)
    ]  # fmt: skip
    found = judge(stacks)
    assert not found.verdict and "every rank stopped in its own code" in found.words


def test_a_rank_in_an_uninterruptible_call_is_an_outlier():
    stacks = three_nodes()
    stacks[4] = RankStack(4, "node3", WAITING, NOW - 1, NOW - 60, state="D")
    assert judge(stacks).nodes == ("node3",)


def test_a_rank_waiting_in_ddps_buffer_broadcast_is_named_by_its_collective():
    # DDP's _sync_buffers (torch/nn/parallel) before forward: only native frames show it.
    frames = (
        Frame("DistributedDataParallel._distributed_broadcast_coalesced",
              "torch/nn/parallel/distributed.py", 1),
        Frame("_train_step", "nvrx_appliance/workloads/trainer.py", 220),
    )  # fmt: skip
    native = ("pthread_cond_wait", "c10d::Work::wait", "c10d::broadcast_coalesced")
    waiting = RankStack(0, "node1", frames, NOW - 1, NOW - 60, native=native)
    found = judge([waiting, stack(1, "node2", FROZEN)])
    assert found.words.endswith("while the 1 other waited in `broadcast_coalesced`")
