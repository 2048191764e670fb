"""Task 0's teardown decision, run from the generation's EXIT trap after the closed flag;
the host half of a fence, run by the batch script of the peer that fenced a dead task 0
(`--fence CLAIM`); and the relay of a generation's end, run by the batch script of the
first peer that left on it (`--relay CLAIM`).

Why Python and why stdlib only: in container mode the batch script runs on the host,
which may not have this package. The burn guard needs the ledger (JSON lines) and a
count over it, which is fragile in bash and easy here; submit copies this file into the
work dir beside run.json (Layout.teardown, owner-only) with the modules it imports
(nvrx_appliance/jobhost/: Layout.host_code), and the batch script checks their owner and mode
before it runs it with the host's python3, so the sbatch stays thin and the work dir's
files alone re-queue a generation. Tests import the same functions.
If no python3 can run it, or the file is not to be trusted, the sbatch falls back to
the two scancel lines in bash.

The pure part (decide, burnt, ...) is ending.py; this is the thin shell around it.
It runs on the host's own python3, which can be as old as RHEL 8's 3.6 (hostlib.py says
what that rules out).
"""

import argparse
import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

if __package__:
    from . import ending, hostlib, node_memory
else:  # run as a script on the job's host: the copies beside this file
    import ending  # type: ignore[import-not-found,no-redef]
    import hostlib  # type: ignore[import-not-found,no-redef]
    import node_memory  # type: ignore[import-not-found,no-redef]

# --- shell --------------------------------------------------------------------------


def _read(path: str, limit: int, tail: bool = False) -> str:
    """hostlib.read_text: bounded, never blocking; "" for a file that is not there to read."""
    return hostlib.read_text(path, limit, tail) or ""


def _log(message: str) -> None:
    hostlib.log("teardown", message)


NOT_RELEASED = "THE CHAIN IS NOT RELEASED; run it by hand or let nvrx-watch reconcile"


def _scancel(argv: List[str], consequence: str = NOT_RELEASED) -> bool:
    out, why = hostlib.slurm(argv, ending.SCANCEL_TIMEOUT_S)
    if out is None and ending.BENIGN_SCANCEL in why:
        # Asked for PENDING tasks of an array that has none left: nothing to release.
        return True
    if out is None:
        _log(f"ERROR: {' '.join(argv)} failed ({why}). " + consequence)
        return False
    return True


def _load_manifest(path: str) -> Dict[str, Any]:
    distrust = hostlib.untrusted(path, os.geteuid())
    if distrust:
        _log(f"ERROR: ignoring {path} ({distrust}): no burn guard for this generation")
        return {}
    try:
        manifest = json.loads(_read(path, ending.SMALL_FILE_BYTES) or "{}")
    except ValueError:
        return {}
    return manifest if isinstance(manifest, dict) else {}


def _history(path: str, chain: str) -> List[Dict[str, Any]]:
    ledger_text = _read(path, ending.LEDGER_TAIL_BYTES, tail=True)
    entries = ending.parse_ledger(ledger_text)
    skipped = sum(1 for line in ledger_text.splitlines() if line.strip()) - len(entries)
    if skipped:
        _log(f"skipped {skipped} unreadable line(s) of the ledger {path}")
    return ending.chain_history(entries, chain)


def _record(path: str, entry: Dict[str, Any]) -> None:
    try:
        hostlib.append_lines(path, [entry], mode=0o644)
    except OSError as exc:
        _log(f"ERROR: could not append to the ledger {path}: {exc}")


def _claim(path: str, uid: int) -> Optional[Dict[str, Any]]:
    """The fence claim the entrypoint created, if it is ours to trust."""
    problem = hostlib.untrusted(path, uid)
    if problem:
        _log(f"ERROR: ignoring the fence claim {path} ({problem})")
        return None
    try:
        claim = json.loads(_read(path, ending.SMALL_FILE_BYTES) or "null")
    except ValueError:
        claim = None
    return claim if isinstance(claim, dict) else None


def drained_nodes(args: argparse.Namespace, this: Dict[str, Any]) -> List[str]:
    """The generation's drained nodes, for its ledger entry (one small bounded read)."""
    try:
        return node_memory.drained_nodes(args.drain_poll, this["chain"], args.array_job_id)
    except Exception as exc:  # never at the cost of the ledger entry
        _log(f"ERROR: reading this generation's drained nodes failed: {exc}")
        return []


def workload_account(
    args: argparse.Namespace, chain: str
) -> Tuple[Optional[Dict[str, Any]], List[Dict[str, Any]], List[str]]:
    """(the workload's verdict, each cycle's failure, the nodes whose workers gave the
    verdict) of this generation, as its guards left them: nothing another user could
    have written, or that names another generation."""
    uid = os.geteuid()
    verdict = None
    if args.verdict and os.path.lexists(args.verdict):
        problem = hostlib.untrusted(args.verdict, uid)
        if problem:
            _log(f"ERROR: ignoring the workload's verdict {args.verdict} ({problem})")
        else:
            verdict = ending.verdict_of(
                _read(args.verdict, ending.CONTROL_BYTES), chain, args.array_job_id
            )
    texts = []
    nodes = []  # type: List[str]
    exits = args.exits_dir
    for name in _listdir(exits)[: ending.MAX_EXIT_FILES]:
        path = os.path.join(exits, name)
        if name.startswith("cycle") and name.endswith(".json") and not hostlib.untrusted(path, uid):
            texts.append(_read(path, ending.CONTROL_BYTES))
    for name in _listdir(os.path.join(exits, "verdict_nodes"))[: ending.MAX_EXIT_FILES]:
        if ending.NODE_NAME.match(name):
            nodes.append(name)
    if verdict is not None:
        # The guard of the verdict's first worker that named its iteration wrote this.
        named = os.path.join(exits, "verdict_iteration.json") if exits else ""
        extra = []  # type: List[str]
        if named and os.path.isfile(named) and not hostlib.untrusted(named, uid):
            extra.append(_read(named, ending.CONTROL_BYTES))
        accounts = [
            a for a in (ending.verdict_of(t, chain, args.array_job_id) for t in texts + extra) if a
        ]  # fmt: skip
        verdict = dict(
            verdict, iteration=ending.verdict_iteration(verdict, accounts), nodes=sorted(nodes)
        )
    return verdict, ending.parse_exits(texts, chain, args.array_job_id), sorted(nodes)


def _listdir(path: str) -> List[str]:
    try:
        return sorted(os.listdir(path)) if path else []
    except OSError:
        return []


def elsewhere(
    args: argparse.Namespace,
    this: Dict[str, Any],
    action: str,
    nodes: List[str],
    history: List[Dict[str, Any]],
) -> None:
    """Keep the next generation off the nodes that ran a resume-elsewhere verdict; and
    when that verdict came back on other nodes (the data, not a GPU), take back what the
    first one kept out: those nodes were never bad."""
    if int(_load_manifest(args.run_json).get("spec", {}).get("exclude_for", 0)) <= 0:
        return
    try:
        if action == ending.RESUME_ELSEWHERE:
            node_memory.keep_elsewhere(
                record=args.exclusions, nodes=nodes, chain=this["chain"],
                array_job_id=args.array_job_id, iteration=this["verdict"].get("iteration"),
                log=_log,
            )  # fmt: skip
        elif action == ending.STOPPED_BY_WORKLOAD:
            cleared = [
                node for e in history if isinstance(e.get("verdict"), dict)
                for node in e["verdict"].get("nodes") or []
            ]  # fmt: skip
            node_memory.clear(
                record=args.exclusions, nodes=sorted(set(cleared)), chain=this["chain"],
                reason="the workload's verdict recurred on other nodes: the data, not a node",
                log=_log,
            )  # fmt: skip
    except Exception as exc:  # never at the cost of the ledger entry
        _log(f"ERROR: recording where the next generation must run failed: {exc}")


def hung_account(args: argparse.Namespace, chain: str) -> List[Dict[str, Any]]:
    """The generation's standing hang verdicts (docs/hangs.md), for the ledger's words."""
    return _account(node_memory.hung_nodes, args.hangs, chain, args, "hang verdicts")


def dead_account(args: argparse.Namespace, chain: str) -> List[Dict[str, Any]]:
    """The nodes task 0 found dead in this generation (docs/liveness.md), for the ledger."""
    return _account(node_memory.dead_nodes, args.deaths, chain, args, "node deaths")


def _account(
    read: Callable[[str, str, str], List[Dict[str, Any]]],
    folder: str,
    chain: str,
    args: argparse.Namespace,
    what: str,
) -> List[Dict[str, Any]]:
    """One kind of the generation's records; never at the cost of the ledger entry."""
    try:
        return read(folder, chain, args.array_job_id)
    except Exception as exc:
        _log(f"ERROR: reading this generation's {what} failed: {exc}")
        return []


def straggler_account(args: argparse.Namespace, chain: str) -> List[Dict[str, Any]]:
    """The stragglers task 0 named in this generation, and what it did about each
    (node/straggler_leave.py's `named.<node>`), for the ledger; none from a file another
    run left under a reused array job id; never at the cost of the entry."""
    if not args.stragglers:
        return []
    try:
        names = sorted(n for n in os.listdir(args.stragglers) if n.startswith("named."))
    except OSError:
        return []  # no straggler was named
    found = []
    for name in names[: ending.MAX_STRAGGLER_FILES]:
        try:
            named = json.loads(_read(os.path.join(args.stragglers, name), ending.CONTROL_BYTES))
        except ValueError:
            continue
        if not isinstance(named, dict):
            continue
        if str(named.get("generation", "")).split("/")[:2] != [chain, args.array_job_id]:
            continue
        found.append({key: named.get(key) for key in ending.STRAGGLER_FIELDS})
    return found


def remember_nodes(
    args: argparse.Namespace,
    this: Dict[str, Any],
    fenced_task0: str,
    exits: Optional[List[Dict[str, Any]]] = None,
) -> bool:
    """Judge this generation's bad nodes into the exclusion record, after the ledger entry
    is written: what node memory reads (the launcher log, the record) can never cost the
    generation its entry. Whether that worked, so that apply_exclusions may follow."""
    try:
        node_memory.remember(
            record=args.exclusions, launcher_log=args.launcher_log,
            drained=this.get("drained", []), fenced_task0=fenced_task0,
            spec=_load_manifest(args.run_json).get("spec", {}), chain=this["chain"],
            array_job_id=args.array_job_id, log=_log, exits=exits, hangs=args.hangs,
            deaths=args.deaths,
        )  # fmt: skip
    except Exception as exc:
        _log(f"ERROR: judging this generation's nodes failed: {exc}")
        return False
    return True


def apply_exclusions(remembered: bool, args: argparse.Namespace) -> None:
    """The exclusion record onto the chain's queued generations, after the ledger entry
    is written (the singleton dependency holds them until this trap ends)."""
    if not remembered:
        return
    try:
        node_memory.apply(
            record=args.exclusions, submitted=args.submitted,
            manifest=_load_manifest(args.run_json), user=args.user,
            array_job_id=args.array_job_id, log=_log,
        )  # fmt: skip
    except Exception as exc:
        _log(f"ERROR: excluding nodes from the queued generations failed: {exc}")


def fence(args: argparse.Namespace, this: Dict[str, Any]) -> int:
    """The host half of a fence: only the job whose entrypoint won the claim acts, so
    the ledger gets one entry however many peers raced."""
    claim = _claim(args.fence_claim, os.geteuid())
    if claim is None or claim.get("job_id") != args.job_id or not args.job_id:
        return 0
    reason = "fenced by {}: {}".format(claim.get("by", "a peer"), claim.get("reason", ""))
    this.update(
        task0_node=str(claim.get("task0_host", "")),
        start=str(claim.get("task0_started", "")),
        exit_code=None,
        checkpoint_iteration_start=claim.get("checkpoint_start"),
        action=ending.FENCED,
        reason=reason,
    )
    _log(reason + "; cancelling task 0's job and this generation's pending spares")
    ok = bool(args.user) and bool(args.array_job_id)
    if ok:
        results = [
            _scancel(a) for a in ending.fence_argvs(user=args.user, array_job_id=args.array_job_id)
        ]
        ok = all(results)
    else:
        _log("ERROR: user or array job id unknown: nothing cancelled")
    this["scancel_ok"] = ok
    this["drained"] = drained_nodes(args, this)
    _record(args.ledger, this)
    remembered = remember_nodes(args, this, fenced_task0=this["task0_node"])
    apply_exclusions(remembered, args)
    return 0


def fencer(args: argparse.Namespace) -> List[int]:
    """The task that fenced this generation's task 0, if one did: its script cancels task
    0's job, and the relay must not end it first."""
    if not args.fence_claim or not os.path.exists(args.fence_claim):
        return []
    claim = _claim(args.fence_claim, os.geteuid())
    if claim is None or not hostlib.same_generation(
        str(claim.get("generation", "")), args.generation
    ):
        return []
    task = claim.get("task_id")
    return [task] if isinstance(task, int) and not isinstance(task, bool) and task > 0 else []


def relay(args: argparse.Namespace, spec: Dict[str, Any]) -> int:
    """The generation is over; only the job whose entrypoint won the relay claim acts,
    so the array is cancelled once however many peers left on the end."""
    claim = _claim(args.relay_claim, os.geteuid())
    if claim is None or claim.get("job_id") != args.job_id or not args.job_id:
        return 0
    try:
        last_task = sum(int(spec[k]) for k in ("train_tasks", "hot_spares", "cold_spares")) - 1
        task_id = int(args.task_id)
    except (KeyError, TypeError, ValueError):
        _log("ERROR: the array's shape or this task's index is unknown: nothing relayed")
        return 0
    if not args.user or not args.array_job_id:
        _log("ERROR: user or array job id unknown: nothing relayed")
        return 0
    argv = ending.relay_argv(
        user=args.user, array_job_id=args.array_job_id, task_id=task_id, last_task=last_task,
        spared=fencer(args),
    )  # fmt: skip
    if argv:
        _log(
            "{}; cancelling the other tasks of array {} ({})".format(
                claim.get("reason", "the generation is over"), args.array_job_id, argv[-1]
            )
        )
        _scancel(argv, "The other tasks leave on the closed flag instead, more slowly")
    return 0


def teardown(args: argparse.Namespace, this: Dict[str, Any], burn_guard: int) -> int:
    history = _history(args.ledger, this["chain"])
    marker = _read(args.training_done, ending.TRACKER_BYTES) if args.training_done else ""
    done = ending.training_done(marker, this["checkpoint_iteration"])
    if marker.strip() and done is None:
        _log(
            f"ignoring the training-done marker {args.training_done}: it names "
            f"{marker.strip()!r}, the tracker {this['checkpoint_iteration']}"
        )
    verdict, exits, verdict_nodes = workload_account(args, this["chain"])
    action, reason = ending.decide(
        args.exit_code, history, this, burn_guard, bool(args.no_restart_witness),
        done=done, time_limit_notice=bool(args.time_limit_notice), verdict=verdict,
        exits=exits,
    )  # fmt: skip
    if verdict is not None:
        this["verdict"] = {
            key: verdict.get(key)
            for key in ("code", "action", "meaning", "iteration", "line", "node", "rank", "cycle")
        }
        this["verdict"]["nodes"] = verdict_nodes
    told = ending.repeated_failure(exits)
    if told:
        this["workload"] = told
    job_name = this["job_name"]
    if not job_name or not args.user:
        action, reason = ending.NONE, "job name or user unknown: refusing to scancel by name"
    _log(reason)

    ok = True
    if action != ending.NONE:
        ok = _scancel(
            ending.scancel_argv(
                action, job_name=job_name, user=args.user, array_job_id=args.array_job_id,
                chain_ids=hostlib.submitted_ids(args.submitted),
            )
        )  # fmt: skip
    hung = hung_account(args, this["chain"])
    dead = dead_account(args, this["chain"])
    handed = [h["words"] for h in hung + dead if h.get("hand_off")]
    if handed and action == ending.RELEASED_SPARES:
        reason = "{}; no hot spare was free, so the generation handed off and the next one starts without it. {}".format(
            "; ".join(handed), reason
        )
    this.update(action=action, reason=reason, scancel_ok=ok)
    if action == ending.COMPLETED:
        this["final_iteration"] = done
    this["drained"] = drained_nodes(args, this)
    if hung:
        this["hung"] = [
            {"node": h["node"], "words": h["words"], "stacks": h["stacks"]} for h in hung
        ]
    if dead:
        this["dead"] = [{"node": d["node"], "words": d["words"]} for d in dead]
    stragglers = straggler_account(args, this["chain"])
    if stragglers:
        this["stragglers"] = stragglers
    _record(args.ledger, this)
    remembered = remember_nodes(args, this, fenced_task0="", exits=exits)
    if verdict is not None:
        elsewhere(args, this, action, verdict_nodes, history)
    # A chain that ends (completed, cancelled, burn guard) has no queued generation left.
    if action in (ending.RELEASED_SPARES, ending.SAVED_AT_TIME_LIMIT, ending.RESUME_ELSEWHERE):
        apply_exclusions(remembered, args)
    if action in ending.CHAIN_ENDS and ok and args.marker:
        # The chain ended on purpose: the watcher must not page "chain exhausted".
        try:
            os.unlink(args.marker)
        except FileNotFoundError:
            pass
        except OSError as exc:
            _log(f"could not remove the chain marker {args.marker}: {exc}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="nvrx-teardown")
    for name in ending.OPTIONS:
        parser.add_argument("--" + name, default="")
    parser.add_argument("--exit-code", type=int)
    parser.add_argument("--fence", action="store_true", help="the host half of a fence")
    parser.add_argument("--relay", action="store_true", help="the relay of a generation's end")
    args = parser.parse_args(argv)
    if not (args.fence or args.relay) and args.exit_code is None:
        parser.error("--exit-code is required (or --fence, or --relay)")

    manifest = _load_manifest(args.run_json)
    spec = manifest.get("spec", {})
    vars(args).update(ending.generation_paths(manifest.get("paths"), args.array_job_id))
    if not args.ledger:
        _log(f"ERROR: {args.run_json} names no ledger: this generation is not recorded")
    args.no_restart_witness = ending.names_ours(
        _read(args.no_restart, ending.CONTROL_BYTES), args.generation
    )
    args.time_limit_notice = ending.names_ours(
        _read(args.time_limit, ending.CONTROL_BYTES), args.generation
    )
    this = {
        "array_job_id": args.array_job_id,
        "job_name": args.job_name or spec.get("job_name", ""),
        "task0_node": args.task0_node,
        "start": args.start,
        "end": hostlib.record_time(),
        "exit_code": args.exit_code,
        "checkpoint_iteration": ending.parse_iteration(_read(args.tracker, ending.TRACKER_BYTES)),
        "checkpoint_iteration_start": ending.parse_iteration(args.checkpoint_start),
        "chain": str(manifest.get("created", "")),
        "mode": spec.get("mode", ""),
    }
    if args.fence:
        # One process for both when this task won both claims: the successor waits for
        # every task's end, and a second interpreter's start is a second on a busy node.
        try:
            return fence(args, this)
        finally:
            if args.relay:
                relay(args, spec)
    if args.relay:
        return relay(args, spec)
    return teardown(args, this, int(spec.get("burn_guard", 0)))


if __name__ == "__main__":
    sys.exit(main())
