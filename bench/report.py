"""Results: what a scenario returns, the one table, and the JSON document. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.timing import ratio, summary

FLOOR_LABEL = "scheduler floor: last task of N ends -> task 0 of N+1 starts"
HELP_LABEL = "nvrx-appliance --help (host tool start)"
HELP_TARGET_S = 0.5  # issue 13: the top-level help answers in well under half a second


@dataclass
class Metric:
    label: str
    samples: list[float]
    target_s: float | None = None
    indent: bool = False  # a phase of the metric above it
    given: dict[str, Any] | None = None  # figures measured elsewhere (the watcher's own bench)
    # What the figures count: seconds, unless a measure names another unit (its figures
    # and target are then in that unit, and are not held against the floor).
    unit: str = "s"

    def figures(self) -> dict[str, Any]:
        if self.given is not None:
            return self.given
        return summary(self.samples)

    def met(self) -> bool | None:
        median = self.figures()["median_s"]
        if self.target_s is None or median is None:
            return None
        return median <= self.target_s


@dataclass
class Result:
    scenario: str
    title: str
    metrics: list[Metric] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None


def phase_metrics(samples: Sequence[dict[str, Any]]) -> list[Metric]:
    """One indented metric per phase, in timeline order, over the samples that have it."""
    order: list[str] = []
    for sample in samples:
        for name in sample.get("phases", {}):
            if name not in order:
                order.append(name)
    return [
        Metric(name, [s["phases"][name] for s in samples if name in s["phases"]], indent=True)
        for name in order
    ]


def process_start(machine: dict[str, Any]) -> Result:
    """What starting one process of each kind costs here: where much of a recovery's
    time goes on a small machine."""
    return Result(
        "reference",
        "0 process start",
        metrics=[
            *(
                Metric(f"fresh Python: import {name}", samples)
                for name, samples in machine.get("import_s", {}).items()
            ),
            Metric(HELP_LABEL, machine.get("help_s", []), target_s=HELP_TARGET_S),
        ],
        notes=["measured at the start of the run, the cluster idle"],
    )


def floor_median(results: Sequence[Result]) -> float | None:
    for result in results:
        for metric in result.metrics:
            if metric.label == FLOOR_LABEL:
                return metric.figures()["median_s"]
    return None


def versus(results: Sequence[Result], ours: str, theirs: str) -> str | None:
    """One line holding two scenarios' headline medians against each other (the first
    metric of each), or None when either is missing."""
    heads = {r.scenario: r.metrics[0] for r in results if r.metrics}
    if ours not in heads or theirs not in heads:
        return None
    a, b = heads[ours].figures()["median_s"], heads[theirs].figures()["median_s"]
    if not a or b is None:
        return None
    return (
        f"{heads[theirs].label}: {_seconds(b)} s, {b / a:.1f}x the appliance's "
        f"{_seconds(a)} s ({heads[ours].label}), medians of the same run"
    )


# --- the table ---------------------------------------------------------------------------------


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if abs(value) < 1 else f"{value:.2f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}x"


def _verdict(metric: Metric) -> str:
    met = metric.met()
    if met is None:
        return ""
    return f"<= {metric.target_s:g} {metric.unit}: {'met' if met else 'MISSED'}"


def table(results: Sequence[Result]) -> str:
    """One Markdown table: readable in a terminal, pasted as is into docs/benchmarks.md.
    Figures are seconds, but where a measure names its unit in parentheses."""
    floor = floor_median(results)
    lines = [
        "| scenario | measure | n | median | min | max | / floor | target |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for result in results:
        if result.error:
            lines.append(f"| {result.title} | FAILED: {result.error} | | | | | | |")
        for i, metric in enumerate(result.metrics):
            f = metric.figures()
            label = f"- {metric.label}" if metric.indent else metric.label
            if metric.unit != "s":
                label += f" ({metric.unit})"
            over_floor = ratio(f["median_s"], floor) if metric.unit == "s" else None
            lines.append(
                f"| {result.title if i == 0 and not result.error else ''} | {label} | {f['n']} | "
                f"{_seconds(f['median_s'])} | {_seconds(f['min_s'])} | {_seconds(f['max_s'])} | "
                f"{_ratio(over_floor)} | {_verdict(metric)} |"
            )
    return "\n".join(lines)


# --- the JSON document ----------------------------------------------------------------------------


def document(
    results: Sequence[Result], machine: dict[str, Any], run: dict[str, Any]
) -> dict[str, Any]:
    floor = floor_median(results)
    return {
        "benchmark": "nvrx-appliance recovery benchmarks (issue 7)",
        "run": run,
        "machine": machine,
        "floor_median_s": floor,
        "scenarios": [
            {
                "scenario": r.scenario,
                "title": r.title,
                "error": r.error,
                "notes": r.notes,
                "metrics": [
                    {
                        "label": m.label,
                        "unit": m.unit,
                        "indent": m.indent,
                        "given": m.given is not None,
                        **m.figures(),
                        "median_over_floor": ratio(m.figures()["median_s"], floor)
                        if m.unit == "s"
                        else None,
                        "target_s": m.target_s,
                        "met": m.met(),
                        "samples_s": m.samples,
                    }
                    for m in r.metrics
                ],
                "samples": r.samples,
            }
            for r in results
        ],
    }


def results_of(document: dict[str, Any]) -> list[Result]:
    """The results a stored document holds, as `table` reads them: each metric from its
    samples, or from its figures where they were measured elsewhere."""
    found = []
    for stored in document.get("scenarios", []):
        metrics = [
            Metric(
                m["label"],
                list(m.get("samples_s") or []),
                target_s=m.get("target_s"),
                indent=bool(m.get("indent")),
                given={k: m.get(k) for k in ("n", "median_s", "min_s", "max_s")}
                if m.get("given")
                else None,
                unit=m.get("unit", "s"),
            )
            for m in stored.get("metrics", [])
        ]
        found.append(
            Result(stored["scenario"], stored["title"], metrics, stored.get("samples", []),
                   stored.get("notes", []), stored.get("error"))
        )  # fmt: skip
    return found


def merged(full: dict[str, Any], partial: dict[str, Any], order: Sequence[str]) -> dict[str, Any]:
    """The stored full run with a partial run's scenarios in place of its own, in `order`;
    the document says which rows came from which run. The full run's floor stays, so that
    the rows not re-run keep the ratios they were published with; the rows re-run are held
    against it too (the partial run's own floor is in its own document)."""
    own = {"reference", "floor"}
    fresh = {s["scenario"]: s for s in partial["scenarios"] if s["scenario"] not in own}
    by_name = {s["scenario"]: s for s in full["scenarios"]} | fresh
    rank = {name: i for i, name in enumerate(["reference", *order])}
    scenarios = sorted(by_name.values(), key=lambda s: rank.get(s["scenario"], len(rank)))
    run = dict(full["run"])
    earlier = [
        {**r, "scenarios": [n for n in r["scenarios"] if n not in fresh]}
        for r in run.get("refreshed", [])
    ]
    latest = {k: partial["run"][k] for k in ("started", "command")}
    latest["scenarios"] = list(fresh)
    run["refreshed"] = [*[r for r in earlier if r["scenarios"]], latest]
    return {**full, "run": run, "scenarios": scenarios}
