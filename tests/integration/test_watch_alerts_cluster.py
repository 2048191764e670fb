"""The shipped alert rules with the real parts, all on loopback: nvrx-watch writes its
textfile for a chain on the local cluster, Debian's node_exporter serves it, Debian's
Prometheus scrapes it and evaluates the rules as shipped, and Alertmanager receives.

A healthy chain raises nothing; the chain cancelled from outside while its chain marker
says it should run raises NvrxChainExhausted in Alertmanager after the rule's own
`for:` (docs/watch.md, Alert rules: Timing). That the chain taken out of the watch (its
watcher stopped, its --metrics-file deleted) resolves it once the rule's
`keep_firing_for:` has passed is the rules' own timing, pinned by promtool
(tests/unit/alerts/nvrx-appliance.timing.test.yml).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from nvrx_appliance.watch.alerts import RULES

from .alerting_support import INTERVAL_S, alerting
from .test_watch_cluster import Chain

pytestmark = pytest.mark.cluster

WATCH = str(Path(sys.executable).parent / "nvrx-watch")
PASS_S = 2  # the watcher's --interval in this test (a pass a minute in production)
_RULE = next(r for r in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
             if r["alert"] == "NvrxChainExhausted")  # fmt: skip
FOR_S = int(_RULE["for"].removesuffix("m")) * 60  # as shipped
# From the pass that sees the chain gone to Alertmanager: the `for:`, a pass, a scrape and
# an evaluation; 15 s more for sacct to record the cancel and a pass on a busy machine.
RAISED_WITHIN_S = FOR_S + PASS_S + 2 * INTERVAL_S + 15


def test_a_chain_cancelled_from_outside_raises_its_alert_in_alertmanager(cluster, tmp_path):
    chain = Chain(cluster, "watch-alerts")
    (chain.work / "chain.active").write_text("")  # the chain should be running
    with alerting(tmp_path / "alerting") as alerts:
        job = chain.submit(None)
        metrics = alerts.textfile_dir / f"nvrx_{chain.name}.prom"
        log = (tmp_path / "watch.log").open("w")
        watcher = subprocess.Popen(
            [WATCH, job, "--work-dir", str(chain.work), "--interval", str(PASS_S),
             "--metrics-file", str(metrics), "--state-dir", str(tmp_path / "state")],
            env=cluster.env(), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            chain.wait_tasks(job, lambda t: t.get(0) == "RUNNING", "the generation to run")
            found = f'nvrx_watch_findings{{chain="{chain.name}",detector="chain_exhausted"}}'
            [series] = cluster.wait_until(
                lambda: alerts.query(found), 60, "Prometheus to scrape the watcher's series", 0.5
            )
            assert series["metric"]["severity"] == "critical" and series["value"][1] == "0"

            # Healthy: rules evaluated again and again over the chain's series, nothing
            # pending or firing for it, nothing in Alertmanager.
            first = alerts.evaluations()
            cluster.wait_until(lambda: alerts.evaluations() != first, 30, "an evaluation", 0.2)
            ours = [a for a in alerts.rule_alerts() if a["labels"].get("chain") == chain.name]
            assert ours == [], ours
            assert alerts.received(chain=chain.name) == []

            chain.cancel()  # from outside: the chain marker still says it should run
            stopped = time.monotonic()
            cluster.wait_until(
                lambda: alerts.query(f"{found} > 0"), 60, "the watcher to find it exhausted", 0.5
            )
            seen = time.monotonic()
            [raised] = cluster.wait_until(
                lambda: alerts.received(alertname="NvrxChainExhausted", chain=chain.name),
                RAISED_WITHIN_S + 30,
                "NvrxChainExhausted in Alertmanager",
                0.5,
            )
            took, waited = time.monotonic() - stopped, time.monotonic() - seen
            print(f"alert in Alertmanager {took:.1f} s after the cancel "
                  f"({waited:.1f} s after this test saw the finding in Prometheus)")  # fmt: skip
            # The `for:` held (less the poll that saw the finding late), and no longer.
            assert waited >= FOR_S - 2 * INTERVAL_S and took <= RAISED_WITHIN_S
            assert raised["status"]["state"] == "active"
            assert raised["labels"]["severity"] == "critical"
            assert raised["labels"]["owner"] == "root"
            assert raised["annotations"]["summary"].startswith(
                f"chain {chain.name} (root) has no generation left, running or queued"
            )
            assert raised["annotations"]["runbook_url"] == "docs/watch.md#nvrxchainexhausted"
            # The one alert of the chain: the silence and source alerts stay quiet.
            names = {a["labels"]["alertname"] for a in alerts.received(chain=chain.name)}
            assert names == {"NvrxChainExhausted"}
        finally:
            watcher.send_signal(signal.SIGTERM)
            watcher.wait(timeout=60)
            log.close()
            chain.cancel()

        # Leaving the watch (the watcher stopped, its file deleted, as docs/watch.md says)
        # resolves the alert keep_firing_for after its series goes: the rules' own timing,
        # which promtool pins (tests/unit/alerts/nvrx-appliance.timing.test.yml) where this
        # test would wait out its two minutes.
