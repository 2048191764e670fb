"""The knob reference matches the code, and the demo's report says what happened."""

from pathlib import Path

from nvrx_appliance.chain.status import ChainView, CycleView, GenerationView
from nvrx_appliance.settings import knobs
from nvrx_appliance.settings.chain import flag, spec_fields
from nvrx_appliance.workflows import demo_report

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_docs_knobs_md_is_generated_from_chain_py():
    assert (DOCS / "knobs.md").read_text() == knobs.markdown(), (
        "regenerate with: python -m nvrx_appliance.settings.knobs > docs/knobs.md"
    )


def test_every_setting_has_a_row_with_its_flag():
    text = knobs.markdown()
    for field in spec_fields():
        assert f"| `{flag(field.name)}`" in text


def _generation(array_job_id, node, start, end, cycles=()):
    return GenerationView(
        array_job_id=array_job_id, state="ended", running=0, pending=0, done=3,
        task0_node=node, task0_state="FAILED", exit_code=1, checkpoint_start=start,
        checkpoint_end=end, action="released_spares", reason="", admission="", cycles=cycles,
    )  # fmt: skip


VIEW = ChainView(
    job_name="nvrx-demo",
    user="alice",
    work_dir="/shared/demo",
    mode="handoff",
    workload="cpu",
    array_spec="0-2%2",
    active_tasks=2,
    checkpoint_now=130,
    generations=(
        _generation("12", "node1", None, 105, (CycleView(0, 100.0, 109.0, "node[1]", ""),)),
        _generation("13", "node2", 105, 130),
    ),
    queued=(),
    chain_marker=True,
)
EVENTS = [
    {"event": "start", "iteration": 0, "cycle": 0, "slurm_array_job_id": "12", "time": 101.0},
    {"event": "fault", "kind": "exception", "rank": 1, "cycle": 0, "time": 108.0},
    {"event": "start", "iteration": 105, "cycle": 0, "slurm_array_job_id": "13", "host": "node2",
     "time": 140.0},
]  # fmt: skip
LEDGER = [
    {"array_job_id": "12", "checkpoint_iteration": 105, "end": "1970-01-01T00:02:10Z"},
    {"array_job_id": "13", "checkpoint_iteration": 130, "end": "1970-01-01T00:03:00Z"},
]


# Lines as NVRx 0.7.0's ft_launcher writes them (recorded from the demo).
NVRX_LOG = """\
2026-11-30 19:26:03,816 [INFO] [node1] [workload:?(?) infra:0(0)] launcher.py:636 [default] \
Worker group UNHEALTHY. 8/8 attempts left; will restart worker group
2026-11-30 19:26:06,156 [WARNING] [node1] [workload:?(?) infra:0(0)] \
health_check_injector.py:142 INJECTING FAILURE: node=node1, infra_rank=0, cycle=1
"""


def test_the_report_confirms_the_resume_point_against_the_predecessors_checkpoint():
    logs = {"12": demo_report.nvrx_log(NVRX_LOG)}
    result = demo_report.report(VIEW, EVENTS, LEDGER, logs)
    text = "\n".join(result.lines)
    assert result.resumed_ok
    assert "resumed at iteration 105 = last completed checkpoint of the previous generation" in text
    assert "generation 13 started training 10 s later on node2" in text
    assert (
        "generation 12: 1 in-job restart(s) by NVRx; workload faults: exception on rank 1" in text
    )
    assert "cycle 1: the GPU-failure injector failed node1's health check (task 0's node" in text


def test_a_resume_from_the_wrong_iteration_is_called_out():
    wrong = [*EVENTS[:2], {**EVENTS[2], "iteration": 0}]
    result = demo_report.report(VIEW, wrong, LEDGER)
    assert not result.resumed_ok
    assert any(line.startswith("  MISMATCH") for line in result.lines)


def test_progress_events_read_like_a_story():
    assert "training started at iteration 105 on node2" in demo_report.event_line(EVENTS[2])
    assert "restarts the workers in place" in demo_report.event_line(EVENTS[1])
    assert demo_report.event_line({"event": "step", "iteration": 3}) is None


def test_the_report_ends_with_the_goodput_lines():
    from nvrx_appliance.goodput import summary
    from nvrx_appliance.goodput.account import account
    from tests.unit.test_goodput import chain_inputs

    goodput = account(chain_inputs())
    result = demo_report.report(VIEW, EVENTS, LEDGER, goodput=goodput)
    assert result.lines[-len(summary.lines(goodput)) :] == summary.lines(goodput)
    assert result.lines[-len(summary.lines(goodput)) - 1] == ""
