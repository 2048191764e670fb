"""The Prometheus alert rules for the series nvrx-watch writes (docs/watch.md, "Alert
rules"). Shipped in the wheel, so `nvrx-watch --alert-rules` finds them on a login node."""

from pathlib import Path

RULES = Path(__file__).with_name("nvrx-appliance.rules.yml")
