"""A SIGKILL is a hang's only when nothing else says it sent it: the OOM killer (the
cgroup's count) or the straggler leaver (its mark, written before it kills)."""

from __future__ import annotations

import json

from nvrx_appliance.rank import kill_cause


def test_the_oom_killers_count_is_read_from_this_cgroup_v1_or_v2(tmp_path, monkeypatch):
    monkeypatch.setattr(kill_cause, "CGROUP_ROOT", tmp_path)
    table = tmp_path / "cgroup"
    table.write_text("4:memory:/job/step\n0::/\n")
    assert kill_cause.oom_kills(table) is None
    (tmp_path / "memory" / "job" / "step").mkdir(parents=True)
    (tmp_path / "memory" / "job" / "step" / "memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"
    )
    assert kill_cause.oom_kills(table) == 2
    table.write_text("0::/job/step\n")
    (tmp_path / "job" / "step").mkdir(parents=True)
    (tmp_path / "job" / "step" / "memory.events").write_text("low 0\noom 1\noom_kill 1\n")
    assert kill_cause.oom_kills(table) == 1


def test_a_kill_the_oom_killer_or_the_straggler_leaver_sent_is_not_a_hang(tmp_path):
    args = {"stragglers": tmp_path, "node": "node2", "generation": "c/41/t"}
    assert kill_cause.not_a_hang(oom_before=0, oom_now=0, **args) is None
    assert kill_cause.not_a_hang(oom_before=None, oom_now=3, **args) is None  # unknown
    assert "OOM killer" in (kill_cause.not_a_hang(oom_before=0, oom_now=1, **args) or "")
    (tmp_path / "ended.node2").write_text(json.dumps({"generation": "c/40/t"}))
    assert kill_cause.not_a_hang(oom_before=0, oom_now=0, **args) is None  # another's
    (tmp_path / "ended.node2").write_text(json.dumps({"generation": "c/41/t"}))
    assert "straggler leaver" in (kill_cause.not_a_hang(oom_before=0, oom_now=0, **args) or "")
