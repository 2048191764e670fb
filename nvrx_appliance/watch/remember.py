"""nvrx-watch --act on suspect_node: the nodes go into the chain's exclusion record.

The record is the one task 0's teardown keeps (observe/exclusions.py); the teardown at
the running generation's end puts it in the queued generations' ExcNodeList, within the
cap that keeps the chain schedulable. The watcher itself calls no Slurm command here and
never drains a node: draining is the administrator's.
"""

from __future__ import annotations

from nvrx_appliance.clock import iso_utc
from nvrx_appliance.jobhost import hostlib
from nvrx_appliance.observe.exclusions import excluded_line
from nvrx_appliance.watch.findings import Action, Finding, Snapshot


def exclude(action: Action, finding: Finding, snap: Snapshot) -> None:
    """Append one line per node, in one write with O_APPEND, as the teardown does
    (hostlib.append_text): a line is never split by a teardown appending at the same
    moment, and a short write (a full quota) raises rather than tear the next line."""
    now = snap.observed_at
    text = "".join(
        excluded_line(
            node,
            f"nvrx-watch {finding.detector}: {finding.summary}",
            since=iso_utc(now) or "",
            until=iso_utc(now + snap.run.exclude_for) or "",
            chain=snap.run.chain,
            generation=action.array_job_id,
            by="nvrx-watch",
        )
        for node in action.nodes
    )
    # The gate checked that the action names this chain's own record (Layout.exclusions).
    (record,) = action.argv
    hostlib.append_text(record, text)
