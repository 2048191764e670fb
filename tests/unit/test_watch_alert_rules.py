"""The shipped Prometheus alert rules: promtool's own tests of every alert (firing on a
finding that stands, quiet on a healthy chain and on a finding one pass saw), one alert
per detector at the detector's severity, a runbook section for each, and the flag that
finds the file on a login node."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from nvrx_appliance.cli.watch import watch
from nvrx_appliance.watch import detectors
from nvrx_appliance.watch.alerts import RULES

ROOT = Path(__file__).resolve().parents[2]
RULE_TESTS = Path(__file__).parent / "alerts" / "nvrx-appliance.rules.test.yml"
# Reported by the watch-source alert (nvrx_watch_source_up names the source), not by count.
BY_SOURCE = {"source_unavailable"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true, but promtool is missing: run scripts/install-system-deps.sh")
    pytest.skip("promtool is missing (Debian's prometheus package; scripts/install-system-deps.sh)")


def rules() -> list[dict]:
    return yaml.safe_load(RULES.read_text())["groups"][0]["rules"]


def test_promtool_passes_the_rules_own_tests():
    # The alerts at a pass a minute, and the timing at a 15 s scrape (a pass written late).
    files = sorted(RULE_TESTS.parent.glob("*.test.yml"))
    assert [f.name for f in files] == [RULE_TESTS.name, "nvrx-appliance.timing.test.yml"]
    result = subprocess.run(
        [promtool(), "test", "rules", *map(str, files)], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == 2


def test_promtool_refuses_a_test_that_expects_the_wrong_thing(tmp_path):
    # The tests above can fail: the same file, one expected severity changed, fails.
    text = RULE_TESTS.read_text().replace("severity: critical", "severity: warning", 1)
    broken = tmp_path / "alerts" / RULE_TESTS.name
    broken.parent.mkdir()
    broken.write_text(text.replace("../../../nvrx_appliance/watch/alerts/", f"{RULES.parent}/"))
    result = subprocess.run(
        [promtool(), "test", "rules", str(broken)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1 and "FAILED" in result.stdout + result.stderr


def test_every_detector_has_an_alert_at_its_severity_and_every_alert_is_tested():
    by_detector = {}
    for rule in rules():
        found = re.search(r'detector="(\w+)"', rule["expr"])
        if found:
            by_detector[found.group(1)] = rule
    assert set(by_detector) == set(detectors.NAMES) - BY_SOURCE
    for d in detectors.ALL:
        if d.name in by_detector:
            assert by_detector[d.name]["labels"]["severity"] == d.severity, d.name
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        case["alertname"]
        for group in tests
        for case in group["alert_rule_test"]
        if case["exp_alerts"]
    }
    quiet = {
        case["alertname"]
        for group in tests
        for case in group["alert_rule_test"]
        if not case["exp_alerts"]
    }
    names = {rule["alert"] for rule in rules()}
    assert fired == names and quiet == names


def test_every_alert_names_its_chain_and_links_its_section_of_the_watch_docs():
    docs = (ROOT / "docs" / "watch.md").read_text()
    anchors = {
        re.sub(r"[^a-z0-9-]", "", h.lower().replace(" ", "-"))
        for h in re.findall(r"(?m)^#+ (.+)$", docs)
    }
    for rule in rules():
        notes = rule["annotations"]
        assert notes["runbook_url"] == f"docs/watch.md#{rule['alert'].lower()}"
        assert rule["alert"].lower() in anchors, f"docs/watch.md has no section {rule['alert']}"
        assert rule["labels"]["severity"] in ("info", "warning", "critical")
        assert "{{ $labels.instance }}" in notes["summary"]
        if "nvrx_watch_" in rule["expr"]:
            assert "chain {{ $labels.chain }}" in notes["summary"]
        if "node_findings" in rule["expr"]:
            assert "node {{ $labels.node }}" in notes["summary"]


def test_alert_rules_prints_the_path_of_the_installed_rules():
    result = CliRunner().invoke(watch, ["--alert-rules"], catch_exceptions=False)
    assert result.exit_code == 0
    assert result.output == f"{RULES}\n"
    assert "- alert: NvrxChainStopped" in Path(result.output.strip()).read_text()


def test_runbook_base_prints_the_rules_with_every_runbook_an_address_a_pager_can_open(tmp_path):
    base = "https://git.example/ml/nvrx-appliance/-/blob/v1"
    result = CliRunner().invoke(watch, ["--runbook-base", base], catch_exceptions=False)
    assert result.exit_code == 0
    printed = yaml.safe_load(result.output)["groups"][0]["rules"]
    assert [r["annotations"]["runbook_url"] for r in printed] == [
        f"{base}/docs/watch.md#{r['alert'].lower()}" for r in rules()
    ]
    installed = tmp_path / "nvrx-appliance.rules.yml"
    installed.write_text(result.output)
    check = subprocess.run([promtool(), "check", "rules", str(installed)], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    docs = (ROOT / "docs" / "watch.md").read_text()
    assert "nvrx-watch --runbook-base" in docs


@pytest.mark.parametrize("base", ["docs.example/nvrx", "ftp://docs.example/", "https://x/?a=1"])
def test_a_runbook_base_that_is_no_web_address_is_refused_naming_it(base):
    result = CliRunner().invoke(watch, ["--runbook-base", base])
    assert result.exit_code == 2
    assert "--runbook-base" in result.output and repr(base) in result.output
