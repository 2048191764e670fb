"""`python -m bench` (`make bench`): the recovery benchmarks of issue 7.

    python -m bench                               # everything, 5 samples each
    python -m bench --only handoff --repeat 5     # a partial run
    python -m bench --publish                     # and refresh docs/benchmarks.md's table

Holds the machine-wide cluster lock for the whole run, so no test session touches the
cluster meanwhile; brings the cluster up if it is not (never takes it down); revives
every node it killed and cancels every job it submitted, even on failure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from bench import (
    beats,
    completion,
    evidence,
    floor,
    handoff,
    healthcheck,
    liveness,
    machine,
    norestart,
    plan,
    plan_inputs,
    readme,
    report,
    restart,
    scale,
    seeds,
    segment,
    segsilent,
    sick_node,
    sigkill,
    silentdeath,
    spare,
    stack_sampling,
    timelimit,
    watcher,
)
from bench.harness import Harness
from bench.report import Result
from nvrx_appliance.devcluster.lock import cluster_lock

SCENARIOS = {
    m.NAME: m
    for m in (
        floor, handoff, sigkill, seeds, spare, norestart, restart, liveness, timelimit,
        completion, healthcheck, segment, segsilent, scale, sick_node, watcher, plan,
        stack_sampling, plan_inputs, silentdeath, beats, evidence,
    )
}  # fmt: skip
NEEDS_NO_CLUSTER = {watcher.NAME, stack_sampling.NAME, plan_inputs.NAME, beats.NAME, evidence.NAME}
RESULTS = Path(__file__).parent / "results"
RESULTS_DOC = Path(__file__).parent.parent / "docs" / "benchmarks.md"
MIN_REPEAT = 5  # issue 7: every figure over at least five samples


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument(
        "--only",
        default="",
        help=f"Comma list of scenarios ({', '.join(SCENARIOS)}); default: all. The floor "
        "runs whenever a cluster scenario does: every latency is reported against it.",
    )
    p.add_argument("--repeat", type=int, default=MIN_REPEAT, help="Samples per scenario.")
    p.add_argument("--out", type=Path, help="JSON file (default: bench/results/...).")
    p.add_argument(
        "--publish", action="store_true", help="Refresh the results table in docs/benchmarks.md."
    )
    args = p.parse_args(argv)
    chosen = [s for s in args.only.split(",") if s] or list(SCENARIOS)
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown:
        p.error(f"--only: unknown scenario {unknown[0]!r}; choose from {', '.join(SCENARIOS)}")
    if args.repeat < 1:
        p.error("--repeat: at least 1 (issue 7 asks for 5 or more)")
    if args.publish and args.repeat < MIN_REPEAT:
        p.error(f"--publish: at least --repeat {MIN_REPEAT}")
    only = set(args.only.split(",")) - {""}
    if args.publish and scale.NAME in only and only - {scale.NAME, floor.NAME}:
        p.error(
            f"--publish: the growth table ({scale.NAME}) is published alone; run the other "
            "scenarios in a run of their own"
        )
    if args.publish and only - {scale.NAME} and not (RESULTS / "recovery.json").exists():
        p.error("--publish: a partial run replaces rows of a stored full run; run "
                "`python -m bench --publish` once first")  # fmt: skip
    if set(chosen) - NEEDS_NO_CLUSTER:
        chosen = [floor.NAME, *[s for s in chosen if s != floor.NAME]]
    args.chosen = [s for s in SCENARIOS if s in chosen]
    return args


def _sayer():
    started = time.monotonic()

    def say(line: str) -> None:
        print(f"bench [{time.monotonic() - started:6.1f}s] {line}", file=sys.stderr, flush=True)

    return say


def _one(module, h: Harness | None, repeat: int, floor_s: float | None, say) -> Result:
    say(f"{module.TITLE}: {repeat} samples")
    started = time.monotonic()
    result = Result(module.NAME, module.TITLE)
    try:
        module.collect(h, repeat, result)
    except Exception as exc:  # one scenario's failure must not lose the others' figures
        say(f"{module.TITLE} FAILED: {exc}\n{traceback.format_exc()}")
        result.error = f"{type(exc).__name__}: {exc}"
    module.finish(result, floor_s)  # what was measured before a failure still counts
    say(f"{module.TITLE}: done in {time.monotonic() - started:.0f} s")
    return result


def run_all(args: argparse.Namespace, say) -> tuple[list[Result], dict]:
    results: list[Result] = []
    on_cluster = [s for s in args.chosen if s not in NEEDS_NO_CLUSTER]
    facts: dict = {}
    if on_cluster:
        if os.geteuid() != 0:
            raise SystemExit(
                "python -m bench: the cluster scenarios need the local Slurm cluster, which "
                "needs root; run as root, or `--only watcher`"
            )
        with cluster_lock(say=say):
            h = Harness(say)
            try:
                h.up()
                facts = machine.facts(h.status)
                floor_s = None
                for name in on_cluster:
                    results.append(_one(SCENARIOS[name], h, args.repeat, floor_s, say))
                    floor_s = floor_s or report.floor_median(results)
            finally:
                h.cleanup()
    for name in args.chosen:
        if name in NEEDS_NO_CLUSTER:
            results.append(_one(SCENARIOS[name], None, args.repeat, None, say))
    return results, facts or machine.facts()


def _merge_into_full_run(partial: dict, say) -> str:
    """The stored full run with this partial run's rows in place of its own, written back
    (bench/results/recovery.json), and the recovery block that shows it."""
    path = RESULTS / "recovery.json"
    full = report.merged(json.loads(path.read_text()), partial, list(SCENARIOS))
    path.write_text(json.dumps(full, indent=2) + "\n")
    say(f"merged into the stored full run: {path}")
    rows = report.results_of(full)
    run = full["run"]
    when = datetime.datetime.fromisoformat(run["started"]).strftime("%Y-%m-%d %H:%M UTC")
    refreshed = [
        "the rows of {} on {} (`{}`)".format(
            ", ".join(r["scenarios"]),
            datetime.datetime.fromisoformat(r["started"]).strftime("%Y-%m-%d %H:%M UTC"),
            r["command"],
        )
        for r in run.get("refreshed", [])
    ]
    table = report.table([r for r in rows if r.scenario != scale.NAME])
    return readme.block(table, when, machine.describe(full["machine"]), run["command"],
                        refreshed=refreshed)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # A TERM (a CI timeout) must still revive nodes and cancel jobs: exit through finally.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    say = _sayer()
    started = datetime.datetime.now(datetime.timezone.utc)
    results, facts = run_all(args, say)
    results = [report.process_start(facts), *results]
    side_by_side = report.versus(results, handoff.NAME, seeds.NAME)
    if side_by_side:
        next(r for r in results if r.scenario == seeds.NAME).notes.append(side_by_side)
    when = started.strftime("%Y-%m-%d %H:%M UTC")
    command = (
        "python -m bench"
        + (f" --only {args.only}" if args.only else "")
        + (f" --repeat {args.repeat}" if args.repeat != MIN_REPEAT else "")
    )
    run = {"started": started.isoformat(timespec="seconds"), "command": command,
           "repeat": args.repeat, "scenarios": args.chosen}  # fmt: skip
    # The growth scenario's rows are many: they go to a table of their own.
    table = report.table([r for r in results if r.scenario != scale.NAME])
    print(table)
    grown = next((r for r in results if r.scenario == scale.NAME), None)
    growth = scale.growth_table(grown.samples) if grown and grown.samples else None
    if growth:
        print(f"\n{scale.TITLE}\n{growth}")
    for result in results:
        for note in result.notes:
            print(f"- {result.title}: {note}")
    out = args.out or RESULTS / (
        "recovery.json" if not args.only else f"partial-{'-'.join(args.chosen)}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    document = report.document(results, facts, run)
    out.write_text(json.dumps(document, indent=2) + "\n")
    say(f"written: {out}")
    if args.publish:
        text = RESULTS_DOC.read_text()
        if not args.only:
            text = readme.with_results(
                text, readme.block(table, when, machine.describe(facts), command)
            )
        elif set(args.chosen) - {scale.NAME, floor.NAME}:
            text = readme.with_results(text, _merge_into_full_run(document, say))
        if growth:
            scale_block = readme.block(growth, when, machine.describe(facts), command, "scale")
            text = readme.with_results(text, scale_block, "scale")
        RESULTS_DOC.write_text(text)
        say(f"results refreshed: {RESULTS_DOC}")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
