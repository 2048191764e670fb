"""Sinks and liveness against a real HTTP server on 127.0.0.1: what PagerDuty and a
webhook receive, when the heartbeat is sent, and what a failing sink does to a pass."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from nvrx_appliance.watch import detectors, sinks, target
from nvrx_appliance.watch import run_loop as watch_shell
from nvrx_appliance.watch.config import Settings, Thresholds
from nvrx_appliance.watch.platform import SlurmPlatform, SlurmUnavailable
from nvrx_appliance.watch.watcher import Watcher
from tests.unit.test_watch_slurm import SACCT_TIMED_OUT, Replay, one_pass

FIXTURES = Path(__file__).parent / "fixtures" / "watch"
ROUTING_KEY = "R0UTING-KEY-do-not-log"
HOOK_TOKEN = "T0KEN-in-the-webhook-url"
BEAT_TOKEN = "HB-uuid-in-the-heartbeat-url"


class Receiver(ThreadingHTTPServer):
    """Records every request: (method, path, decoded JSON body or None)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, object]] = []
        self.status = 202
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def paths(self, method: str | None = None) -> list[str]:
        return [p for m, p, _ in self.requests if method in (None, m)]

    def bodies(self, prefix: str) -> list[dict]:
        return [b for _, p, b in self.requests if p.startswith(prefix)]


class _Handler(BaseHTTPRequestHandler):
    def _record(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        self.server.requests.append((self.command, self.path, json.loads(raw) if raw else None))
        self.send_response(self.server.status)
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = _record

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def receiver():
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def killed_run(tmp_path: Path) -> Path:
    """A work dir whose only generation was SIGKILLed mid-cycle (real NVRx files)."""
    work = tmp_path / "chain-a"
    target = work / "nvrx" / "4343" / "cycle_infos"
    if target.exists():
        return work
    target.mkdir(parents=True)
    for item in (FIXTURES / "killed").iterdir():
        shutil.copy(item, target / item.name, follow_symlinks=False)
    (work / "checkpoints").mkdir()
    return work


def make_watcher(
    tmp_path,
    url: str,
    *,
    pagerduty_url: str | None = None,
    hook_url: str | None = None,
    stall_seconds: float = 1.0,
) -> Watcher:
    work = killed_run(tmp_path)
    settings = Settings(
        state_file=str(tmp_path / "state" / "state.json"),
        metrics_file=str(tmp_path / "metrics" / "nvrx.prom"),
        pagerduty_url=pagerduty_url or f"{url}/v2/enqueue",
        pagerduty_routing_key=ROUTING_KEY,
        webhook_url=hook_url or f"{url}/hook/{HOOK_TOKEN}",
        heartbeat_url=f"{url}/ping/{BEAT_TOKEN}",
    )
    request = target.Request(platform="none", work_dir=str(work))
    return watch_shell.build(
        request, settings, Thresholds(stall_seconds=stall_seconds), watch_shell.make_logger("")
    )


def test_pagerduty_receives_an_events_v2_trigger_with_the_dedup_key(tmp_path, receiver):
    result = make_watcher(tmp_path, receiver.url).pass_once()
    assert result.exit_code == 2  # cycle_stalled is critical
    [event] = receiver.bodies("/v2/enqueue")
    finding = next(f for f in result.findings if f.detector == "cycle_stalled")
    assert event["routing_key"] == ROUTING_KEY
    assert event["event_action"] == "trigger"
    assert (
        event["dedup_key"]
        == finding.key
        == f"nvrx/{result.snapshot.run.owner}/chain-a/cycle_stalled/4343.0.0"
    )
    payload = event["payload"]
    assert payload["severity"] == "critical"
    stamp = result.snapshot.observed_at
    assert payload["timestamp"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp))
    work = tmp_path / "chain-a"
    assert payload["custom_details"]["status"] == f"nvrx-appliance status chain-a --work-dir {work}"
    assert payload["summary"] == finding.summary
    assert payload["class"] == "cycle_stalled" and payload["component"] == "chain-a"


def test_the_webhook_body_is_slack_compatible_and_carries_the_finding(tmp_path, receiver):
    make_watcher(tmp_path, receiver.url).pass_once()
    [body] = receiver.bodies("/hook/")
    assert body["text"].startswith(
        "nvrx-watch [critical] cycle_stalled: cycle 0 of generation 4343"
    )
    assert body["finding"]["detector"] == "cycle_stalled"
    assert body["finding"]["chain"] == "chain-a"


def test_info_findings_are_logged_but_never_paged(tmp_path, receiver, capsys):
    watcher = make_watcher(tmp_path, receiver.url)
    watcher.run = dataclasses.replace(watcher.run, spares=1)  # as its run.json would say
    watcher.pass_once()
    assert "[info] spares_exhausted" in capsys.readouterr().err
    paged = [b["finding"]["detector"] for b in receiver.bodies("/hook/")]
    assert "spares_exhausted" not in paged


def test_a_finding_is_paged_once_then_again_after_the_cooldown(tmp_path, receiver):
    watcher = make_watcher(tmp_path, receiver.url)
    now = 1_900_000_000.0
    watcher.clock = lambda: now
    watcher.pass_once()
    now += watcher.settings.alert_cooldown - 1
    watcher.pass_once()
    assert len(receiver.bodies("/v2/enqueue")) == 1
    now += 1
    watcher.pass_once()
    assert len(receiver.bodies("/v2/enqueue")) == 2


def test_the_dedup_memory_survives_a_new_process_through_the_state_file(tmp_path, receiver):
    make_watcher(tmp_path, receiver.url).pass_once()
    make_watcher(tmp_path, receiver.url).pass_once()  # a new watcher: cron's next minute
    assert len(receiver.bodies("/v2/enqueue")) == 1


def test_pagerduty_gets_a_resolve_once_the_condition_is_gone(tmp_path, receiver):
    watcher = make_watcher(tmp_path, receiver.url)
    watcher.pass_once()
    cycle = tmp_path / "chain-a" / "nvrx" / "4343" / "cycle_infos" / "cycle_info.4343.0.0"
    data = json.loads(cycle.read_text())
    data["cycle_end_time"] = data["cycle_start_time"]  # the cycle closed after all
    cycle.write_text(json.dumps(data))
    watcher.pass_once()
    actions = [
        (e["event_action"], e["dedup_key"].split("/")[3]) for e in receiver.bodies("/v2/enqueue")
    ]
    assert actions == [("trigger", "cycle_stalled"), ("resolve", "cycle_stalled")]


def test_once_training_completed_every_open_page_is_resolved_and_the_pass_is_clean(
    tmp_path, receiver
):
    watcher = make_watcher(tmp_path, receiver.url)
    assert watcher.pass_once().exit_code == 2  # cycle_stalled paged
    # The chain then finished training, after a busy hour (more generations ended than
    # generation_churn allows): its last teardown wrote `completed`, and Slurm holds
    # nothing of it. The cycle files are as they were.
    work = Path(watcher.run.work_dir)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    entries = [{"array_job_id": str(4300 + i), "exit_code": 0, "end": now,
                "action": "saved_at_time_limit", "reason": "saved"} for i in range(9)]  # fmt: skip
    entries.append(entries[-1] | {"array_job_id": "4343", "action": "completed",
                                  "final_iteration": 200})  # fmt: skip
    (work / "chain.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    quiet = dataclasses.replace(watcher, platform=SlurmPlatform(run=lambda argv, timeout: ""))
    result = quiet.pass_once()
    assert (result.findings, result.exit_code) == ([], 0)
    actions = [(e["event_action"], e["dedup_key"].split("/")[3]) for e in receiver.bodies("/v2/")]
    assert actions[-1] == ("resolve", "cycle_stalled")


def test_a_dedup_key_past_pagerdutys_limit_is_shortened_the_same_way_to_trigger_and_resolve(
    tmp_path, receiver
):
    name = "pretraining-" + "x" * 300  # Slurm takes job names this long
    work = killed_run(tmp_path)
    settings = Settings(state_file=str(tmp_path / "state.json"))
    pagerduty = [sinks.PagerDutySink(f"{receiver.url}/v2/enqueue", ROUTING_KEY, "4343")]
    request = target.Request(platform="none", work_dir=str(work), job_name=name)
    watcher = watch_shell.build(
        request, settings, Thresholds(stall_seconds=1), watch_shell.make_logger("")
    )
    watcher.paging = pagerduty
    watcher.pass_once()
    cycle = work / "nvrx" / "4343" / "cycle_infos" / "cycle_info.4343.0.0"
    data = json.loads(cycle.read_text())
    cycle.write_text(json.dumps(data | {"cycle_end_time": data["cycle_start_time"]}))
    watcher.pass_once()
    trigger, resolved = receiver.bodies("/v2/enqueue")
    assert (trigger["event_action"], resolved["event_action"]) == ("trigger", "resolve")
    assert len(trigger["dedup_key"]) == 255 and trigger["dedup_key"] == resolved["dedup_key"]
    assert trigger["dedup_key"].startswith(f"nvrx/{watcher.run.owner}/pretraining-x")
    assert trigger["payload"]["custom_details"]["status"] == "nvrx-appliance status 4343"
    other = sinks.pagerduty_dedup_key(f"nvrx/{watcher.run.owner}/{name}y/cycle_stalled/4343.0.0")
    assert other != trigger["dedup_key"]  # another chain's key stays another key


def test_a_finding_a_failed_follow_up_hides_is_not_resolved(tmp_path, receiver):
    # Recorded: generation 18's task 0 was SIGKILLed at 18:19:20 and its spares remain;
    # only the follow-up (sacct -j 18_0, then scontrol) knows that it ended.
    pagerduty = [sinks.PagerDutySink(f"{receiver.url}/v2/enqueue", ROUTING_KEY)]
    at = "2026-11-30T18:25:00"  # past the grace
    seeing = Replay(sacct="sacct_no_restart.txt")
    first = one_pass(tmp_path, seeing, "watch-rec-7357", at, paging=pagerduty)
    assert {"orphaned_generation", "stranded_generation"} <= {f.detector for f in first.findings}
    blind = Replay(sacct="sacct_no_restart.txt", follow_up_error=SACCT_TIMED_OUT)
    second = one_pass(tmp_path, blind, "watch-rec-7357", at, paging=pagerduty)
    assert "orphaned_generation" not in {f.detector for f in second.findings}
    events = receiver.bodies("/v2/enqueue")
    assert [e["event_action"] for e in events].count("resolve") == 0  # not seen is not gone
    assert events[-1]["dedup_key"].endswith("/source_unavailable/slurm_follow_up")


def unreachable(argv, timeout):
    """Slurm while slurmctld restarts: every command fails."""
    raise SlurmUnavailable(f"{argv[0]}: Unable to contact slurm controller (connect failure)")


def findings_gauges(path: Path) -> dict[str, str]:
    return {k: v for k, v in series(path.read_text()).items() if "findings{" in k}


def test_a_blind_pass_between_two_seeing_ones_neither_clears_the_gauges_nor_pages_again(
    tmp_path, receiver
):
    """A controller restart: the pass that cannot see Slurm skipped the chain detectors.
    It wrote 0 for them, which resolved NvrxStrandedGeneration and the rest, and the next
    pass paged again. The gauges now carry the last count through it, as the PagerDuty
    sink keeps its page open."""
    pagerduty = [sinks.PagerDutySink(f"{receiver.url}/v2/enqueue", ROUTING_KEY)]
    settings = Settings(state_file=str(tmp_path / "state" / "state.json"),
                        metrics_file=str(tmp_path / "metrics" / "nvrx.prom"))  # fmt: skip
    at = "2026-11-30T18:25:00"
    seeing = Replay(sacct="sacct_no_restart.txt")
    first = one_pass(tmp_path, seeing, "watch-rec-7357", at, paging=pagerduty, settings=settings)
    assert "stranded_generation" in {f.detector for f in first.findings}
    before = findings_gauges(Path(settings.metrics_file))
    stranded = next(k for k in before if 'detector="stranded_generation"' in k)
    assert before[stranded] == "1"

    blind = one_pass(tmp_path, unreachable, "watch-rec-7357", at, paging=pagerduty,
                     settings=settings)  # fmt: skip
    assert blind.degraded and "stranded_generation" not in {f.detector for f in blind.findings}
    during = findings_gauges(Path(settings.metrics_file))
    for detector in ("stranded_generation", "orphaned_generation", "chain_not_cancelled",
                     "generation_churn", "chain_stopped", "chain_exhausted"):  # fmt: skip
        keys = [k for k in before if f'detector="{detector}"' in k]
        assert keys and all(during[k] == before[k] for k in keys), detector  # not 0
    assert 'source="slurm"} 0' in Path(settings.metrics_file).read_text()

    one_pass(tmp_path, seeing, "watch-rec-7357", at, paging=pagerduty, settings=settings)
    assert findings_gauges(Path(settings.metrics_file))[stranded] == "1"
    events = [e for e in receiver.bodies("/v2/enqueue") if "stranded_generation" in e["dedup_key"]]
    assert [e["event_action"] for e in events] == ["trigger"]  # paged once, never resolved


def test_a_watcher_blind_from_its_first_pass_writes_no_finding_it_never_judged(tmp_path):
    # Nothing carried: no sample (an absent series is "no data"), never a 0 ("none").
    settings = Settings(state_file=str(tmp_path / "state" / "state.json"),
                        metrics_file=str(tmp_path / "metrics" / "nvrx.prom"))  # fmt: skip
    one_pass(tmp_path, unreachable, "watch-rec-7357", "2026-11-30T18:25:00", settings=settings)
    written = findings_gauges(Path(settings.metrics_file))
    assert not [k for k in written if 'detector="stranded_generation"' in k]
    assert not [k for k in written if 'detector="chain_exhausted"' in k]
    assert [v for k, v in written.items() if 'detector="source_unavailable"' in k] == ["1"]


def test_the_heartbeat_is_sent_only_after_a_pass_that_could_observe(tmp_path, receiver):
    watcher = make_watcher(tmp_path, receiver.url)
    assert watcher.pass_once().heartbeat_sent
    assert receiver.paths("GET") == [f"/ping/{BEAT_TOKEN}"]
    # Blind to the checkpoint tracker (it exists but cannot be read): degraded, no beat.
    (tmp_path / "chain-a" / "checkpoints" / "latest_checkpointed_iteration.txt").mkdir()
    result = watcher.pass_once()
    assert result.degraded and not result.heartbeat_sent
    assert result.exit_code == 2  # the critical finding still wins
    assert receiver.paths("GET") == [f"/ping/{BEAT_TOKEN}"]
    assert "source_unavailable" in [f.detector for f in result.findings]


def test_a_degraded_pass_without_critical_findings_exits_1(tmp_path, receiver):
    watcher = make_watcher(tmp_path, receiver.url, stall_seconds=10**9)
    (tmp_path / "chain-a" / "checkpoints" / "latest_checkpointed_iteration.txt").mkdir()
    result = watcher.pass_once()
    assert (result.exit_code, result.heartbeat_sent) == (1, False)
    # Blindness itself pages: the source_unavailable warning reached the webhook.
    assert "source_unavailable" in [b["finding"]["detector"] for b in receiver.bodies("/hook/")]


def test_an_unreachable_sink_is_reported_and_the_pass_goes_on(tmp_path, receiver, capsys):
    dead = closed_port_url()
    watcher = make_watcher(tmp_path, receiver.url, pagerduty_url=f"{dead}/v2/enqueue")
    result = watcher.pass_once()
    assert any(e.startswith("pagerduty: unreachable") for e in result.sink_errors)
    assert receiver.bodies("/hook/")  # the next sink still delivered
    assert result.heartbeat_sent  # a sink failure is not blindness
    assert Path(watcher.settings.metrics_file).exists()
    assert "sink pagerduty: unreachable" in capsys.readouterr().err
    # Not recorded as sent: the next pass tries PagerDuty again.
    watcher.paging[0].url = f"{receiver.url}/v2/enqueue"
    watcher.pass_once()
    assert len(receiver.bodies("/v2/enqueue")) == 1


def test_an_http_error_from_a_sink_is_reported_with_its_status(tmp_path, receiver):
    receiver.status = 500
    result = make_watcher(tmp_path, receiver.url).pass_once()
    assert "webhook: HTTP 500 Internal Server Error" in result.sink_errors


def test_secrets_never_reach_the_log_or_the_findings(tmp_path, receiver, capsys):
    dead = closed_port_url()
    watcher = make_watcher(
        tmp_path,
        receiver.url,
        pagerduty_url=f"{dead}/v2/enqueue",
        hook_url=f"{dead}/hook/{HOOK_TOKEN}",
    )
    result = watcher.pass_once()
    logged = capsys.readouterr().err
    text = (
        logged
        + json.dumps([f.__dict__ for f in result.findings], default=str)
        + " ".join(result.sink_errors)
    )
    for secret in (ROUTING_KEY, HOOK_TOKEN, BEAT_TOKEN):
        assert secret not in text
    assert "webhook: unreachable" in logged


def test_the_prometheus_textfile_describes_the_pass(tmp_path, receiver):
    watcher = make_watcher(tmp_path, receiver.url)
    tracker = tmp_path / "chain-a" / "checkpoints" / "latest_checkpointed_iteration.txt"
    tracker.write_text("40")
    os.utime(tracker, (1_700_000_000, 1_700_000_000))  # long before the open cycle began
    watcher.pass_once()
    text = Path(watcher.settings.metrics_file).read_text()
    labels = f'chain="chain-a",owner="{watcher.run.owner}"'
    assert f'nvrx_watch_findings{{{labels},detector="cycle_stalled",severity="critical"}} 1' in text
    assert f"nvrx_watch_cycles{{{labels}}} 1" in text
    assert f"nvrx_watch_current_cycle{{{labels}}} 0" in text
    assert f"nvrx_watch_current_generation{{{labels}}} 4343" in text
    assert f"nvrx_watch_checkpoint_iteration{{{labels}}} 40" in text
    [age] = [ln for ln in text.splitlines() if ln.startswith("nvrx_watch_checkpoint_age_seconds")]
    assert float(age.rsplit(" ", 1)[1]) >= time.time() - 1_700_000_000 - 60
    assert f"nvrx_watch_degraded{{{labels}}} 0" in text
    assert "nvrx_watch_pass_duration_seconds{" in text
    assert 'source="slurm"' not in text  # --platform none: not configured is not "down"


def test_a_sink_url_urllib_refuses_mid_pass_is_a_redacted_error_and_the_pass_goes_on(
    tmp_path, receiver, capsys
):
    watcher = make_watcher(tmp_path, receiver.url, hook_url=f"{receiver.url}/hook/{HOOK_TOKEN}")
    watcher.paging[1].url = f"hooks.example/{HOOK_TOKEN}"  # no scheme: urllib raises ValueError
    watcher.settings = dataclasses.replace(watcher.settings, heartbeat_url=f"nowhere/{BEAT_TOKEN}")
    result = watcher.pass_once()
    logged = capsys.readouterr().err
    assert any(e.startswith("webhook: unusable URL") for e in result.sink_errors)
    assert any(e.startswith("heartbeat: unusable URL") for e in result.sink_errors)
    assert receiver.bodies("/v2/enqueue")  # PagerDuty still paged the critical finding
    assert result.exit_code == 2  # the critical finding decides, not the broken sink
    assert Path(watcher.settings.state_file).exists()  # and the state was saved
    for secret in (HOOK_TOKEN, BEAT_TOKEN):
        assert secret not in logged and secret not in " ".join(result.sink_errors)


def series(text: str) -> dict[str, str]:
    """The textfile's samples: series (name and labels) -> value."""
    return dict(ln.rsplit(" ", 1) for ln in text.splitlines() if not ln.startswith("#"))


def test_the_textfile_keeps_every_series_at_zero_and_holds_no_job_id_in_a_label(tmp_path):
    """An alert on `nvrx_watch_findings{detector="x"} > 0` needs the 0 to be there, and a
    label per generation would grow a new series with every hand-off."""
    empty = tmp_path / "empty"
    empty.mkdir()
    settings = Settings(
        state_file=str(tmp_path / "state" / "state.json"),
        metrics_file=str(tmp_path / "empty.prom"),
    )
    request = target.Request(platform="none", work_dir=str(empty))
    watch_shell.build(request, settings, Thresholds(), watch_shell.make_logger("")).pass_once()
    before = series(Path(settings.metrics_file).read_text())
    for name in detectors.NAMES:
        assert any(s.startswith("nvrx_watch_findings{") and f'detector="{name}"' in s
                   for s in before), name  # fmt: skip
    assert all(v == "0" for s, v in before.items() if s.startswith("nvrx_watch_findings{"))
    assert (
        before[f'nvrx_watch_current_cycle{{chain="empty",owner="{watch_shell.caller_name()}"}}']
        == "NaN"
    )

    recorded = json.loads((FIXTURES / "killed" / "cycle_info.4343.0.0").read_text())
    for hour, generation in enumerate(("4343", "4400")):  # a hand-off to the next generation
        cycles = empty / "nvrx" / generation / "cycle_infos"
        cycles.mkdir(parents=True)
        info = recorded | {"job_id": generation, "cycle_start_time": f"2026-11-30T1{hour}:00:00Z"}
        (cycles / f"cycle_info.{generation}.0.0").write_text(json.dumps(info))
        watch_shell.build(request, settings, Thresholds(), watch_shell.make_logger("")).pass_once()
        after = series(Path(settings.metrics_file).read_text())
        assert after.keys() == before.keys()  # the same series, pass after pass
        assert generation not in "".join(after.keys())
        current = (
            f'nvrx_watch_current_generation{{chain="empty",owner="{watch_shell.caller_name()}"}}'
        )
        assert after[current] == generation


def test_a_dry_run_pages_nobody_and_writes_no_state_metrics_or_heartbeat(
    tmp_path, receiver, capsys
):
    watcher = make_watcher(tmp_path, receiver.url)
    watcher.settings = dataclasses.replace(watcher.settings, dry_run=True)
    result = watcher.pass_once()
    logged = capsys.readouterr().err
    assert result.exit_code == 2  # it still decides: cycle_stalled is critical
    assert receiver.requests == []  # no PagerDuty, webhook or heartbeat
    assert not Path(watcher.settings.state_file).exists()
    assert not Path(watcher.settings.metrics_file).exists()
    key = next(f.key for f in result.findings if f.detector == "cycle_stalled")
    assert f"dry run: would send {key} to pagerduty" in logged
    make_watcher(tmp_path, receiver.url).pass_once()  # the first real pass still pages it
    assert [b["dedup_key"] for b in receiver.bodies("/v2/enqueue")] == [key]


class NotHttp(threading.Thread):
    """A server that answers every connection with a line that is not HTTP."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")


def test_a_reply_that_is_not_http_is_a_redacted_sink_error_and_the_pass_goes_on(
    tmp_path, receiver, capsys
):
    # http.client.BadStatusLine is an HTTPException, neither OSError nor ValueError: it
    # escaped the sink and ended the pass.
    server = NotHttp()
    server.start()
    try:
        watcher = make_watcher(tmp_path, receiver.url, hook_url=f"{server.url}/hook/{HOOK_TOKEN}")
        result = watcher.pass_once()
    finally:
        server.sock.close()
    assert any(e.startswith("webhook: bad reply (BadStatusLine") for e in result.sink_errors)
    assert receiver.bodies("/v2/enqueue") and result.heartbeat_sent
    assert HOOK_TOKEN not in capsys.readouterr().err + " ".join(result.sink_errors)


@pytest.mark.parametrize(
    ("message", "url"),
    [
        ("nonnumeric port: 'T0KEN-abc@hb.example'", "https://hb:T0KEN-abc@hb.example/ping"),
        ("404 for /hook/T0KEN-in-path-0123", "https://hooks.example/hook/T0KEN-in-path-0123"),
        ("refused: ?key=T0KEN-in-query-0123", "https://hc.example/p?key=T0KEN-in-query-0123"),
    ],
)
def test_a_message_quoting_only_a_part_of_a_secret_url_is_redacted(message, url):
    # Redacting the whole URL missed an error that quotes its port, path or query alone.
    redacted = sinks.redact(message, [url])
    assert "T0KEN" not in redacted and "***" in redacted
    assert "hb.example" in sinks.redact("hb.example: " + message, [url])  # the host stays
