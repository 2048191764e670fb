"""Debian's node_exporter, Prometheus and Alertmanager, started for one test on loopback
with their own data directories and free ports, and stopped again (no tests here).

Prometheus loads the alert rules as nvrx-watch ships them (the file `nvrx-watch
--alert-rules` names); only the scrape and evaluation intervals are the test's, 1 s, so
the time an alert takes is the rules' own `for:` plus about a second.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nvrx_appliance.devcluster.poll import wait_until
from nvrx_appliance.watch.alerts import RULES

DAEMONS = ("prometheus-node-exporter", "prometheus", "prometheus-alertmanager")
INTERVAL_S = 1  # the test's scrape and evaluation interval


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


@dataclass(frozen=True)
class Alerting:
    textfile_dir: Path  # node_exporter's textfile directory: the watcher writes here
    prometheus: str  # base URLs
    alertmanager: str

    def query(self, expr: str) -> list[dict]:
        q = urllib.parse.urlencode({"query": expr})
        return get_json(f"{self.prometheus}/api/v1/query?{q}")["data"]["result"]

    def rule_alerts(self) -> list[dict]:
        """Prometheus's view: pending and firing alerts."""
        return get_json(f"{self.prometheus}/api/v1/alerts")["data"]["alerts"]

    def evaluations(self) -> str:
        """The newest evaluation time of the rule group (RFC 3339)."""
        groups = get_json(f"{self.prometheus}/api/v1/rules")["data"]["groups"]
        return max(g["lastEvaluation"] for g in groups)

    def received(self, **labels: str) -> list[dict]:
        """Alertmanager's active alerts (API v2) with these labels."""
        q = urllib.parse.urlencode([("filter", f'{k}="{v}"') for k, v in labels.items()])
        return get_json(f"{self.alertmanager}/api/v2/alerts?{q}")


def _missing() -> list[str]:
    return [d for d in DAEMONS if shutil.which(d) is None]


@contextmanager
def _daemon(argv: list[str], log: Path, ready_url: str) -> Iterator[None]:
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _ready(ready_url, proc, log), 60, f"{argv[0]} to be ready", 0.2)
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ready(url: str, proc: subprocess.Popen, log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"{proc.args[0]} exited {proc.returncode}:\n{log.read_text()}")
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@contextmanager
def alerting(root: Path) -> Iterator[Alerting]:
    """The three daemons on 127.0.0.1, under `root`; nothing is left running after."""
    missing = _missing()
    if missing:
        reason = f"{', '.join(missing)} missing (scripts/install-system-deps.sh installs them)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true, but {reason}", pytrace=False)
        pytest.skip(reason)
    textfile = root / "textfile"
    textfile.mkdir(parents=True)
    node, prom, am = (free_port() for _ in range(3))
    (root / "alertmanager.yml").write_text(
        "route:\n  receiver: nobody\n  group_wait: 1s\n  group_interval: 1s\n"
        "receivers:\n  - name: nobody\n"
    )
    (root / "prometheus.yml").write_text(
        json.dumps(
            {
                "global": {
                    "scrape_interval": f"{INTERVAL_S}s",
                    "evaluation_interval": f"{INTERVAL_S}s",
                },
                "rule_files": [str(RULES)],
                "alerting": {
                    "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am}"]}]}]
                },
                "scrape_configs": [
                    {"job_name": "node", "static_configs": [{"targets": [f"127.0.0.1:{node}"]}]}
                ],
            }
        )  # JSON is YAML
    )
    with ExitStack() as stack:
        stack.enter_context(
            _daemon(
                [
                    "prometheus-node-exporter",
                    f"--web.listen-address=127.0.0.1:{node}",
                    "--collector.disable-defaults",
                    "--collector.textfile",
                    f"--collector.textfile.directory={textfile}",
                ],
                root / "node_exporter.log",
                f"http://127.0.0.1:{node}/metrics",
            )
        )
        stack.enter_context(
            _daemon(
                [
                    "prometheus-alertmanager",
                    f"--config.file={root / 'alertmanager.yml'}",
                    f"--storage.path={root / 'alertmanager'}",
                    f"--web.listen-address=127.0.0.1:{am}",
                    "--cluster.listen-address=",  # no gossip: one Alertmanager, no port
                ],
                root / "alertmanager.log",
                f"http://127.0.0.1:{am}/-/ready",
            )
        )
        stack.enter_context(
            _daemon(
                [
                    "prometheus",
                    f"--config.file={root / 'prometheus.yml'}",
                    f"--storage.tsdb.path={root / 'prometheus'}",
                    f"--web.listen-address=127.0.0.1:{prom}",
                ],
                root / "prometheus.log",
                f"http://127.0.0.1:{prom}/-/ready",
            )
        )
        yield Alerting(textfile, f"http://127.0.0.1:{prom}", f"http://127.0.0.1:{am}")
