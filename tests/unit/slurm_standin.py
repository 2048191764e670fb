"""A stand-in for Slurm's command-line tools, for unit tests of what submit and cancel
do when sbatch fails, hangs or is interrupted, or a job ends under a scancel: cases the
real cluster cannot be made to show on demand. Real submission and cancel are covered by
tests/integration/test_chain_*.

The queue is a JSON-lines file; `sbatch` appends a job to it, `squeue` lists it (those
still queued or running), `sacct` lists every one (as task 0 of its array), `scancel`
marks jobs cancelled, `scontrol show config` answers a few keys. Each call is logged. What one
sbatch call does is steered by files in the stand-in's folder:

- `fail_from`: calls from this number on (1-based) fail like Slurm, queueing nothing;
- `hang_at`: that call hangs (until killed, or until `release` exists); with
  `hang_after_queueing` present it queues its job first, as an sbatch whose answer
  never arrived; it writes `hanging` when it starts to hang.

and what scancel does, by files that list job ids (space-separated):

- `ended_before_cancel`: these end on their own just before the scancel reaches them,
  which then fails on them as Slurm's does ("Invalid job id specified");
- `refuse_cancel`: scancel fails on these, and they stay queued;
- `completing`: these are completing (squeue says so); scancel fails on them as
  Slurm's does ("Invalid job id specified"), and they stay.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STANDIN_USER = "alice"  # who submits, and owns the jobs, in the stand-in's queue

_COMMON = r"""#!{python}
import json, sys, time
from pathlib import Path
HERE = Path({here!r})
QUEUE = HERE / "queue.jsonl"
def jobs():
    if not QUEUE.exists():
        return []
    return [json.loads(line) for line in QUEUE.read_text().splitlines() if line]
def save(rows):
    QUEUE.write_text("".join(json.dumps(r) + "\n" for r in rows))
def calls(name):
    log = HERE / "calls"
    with log.open("a") as fh:
        fh.write(name + " " + " ".join(sys.argv[1:]) + "\n")
    return sum(1 for line in log.read_text().splitlines() if line.startswith(name + " "))
def option(name):
    for arg in sys.argv[1:]:
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return ""
"""

_SBATCH = """
n = calls("sbatch")
def queue_one():
    rows = jobs()
    job_id = str(100 + len(rows) + 1)
    rows.append({{"id": job_id, "name": option("--job-name"), "work_dir": option("--chdir"),
                 "user": {user!r}, "state": "PENDING"}})
    save(rows)
    return job_id
fail_from = HERE / "fail_from"
if fail_from.exists() and n >= int(fail_from.read_text()):
    print("sbatch: error: QOSMaxSubmitJobPerUserLimit", file=sys.stderr)
    sys.exit(1)
hang_at = HERE / "hang_at"
if hang_at.exists() and n == int(hang_at.read_text()):
    if (HERE / "hang_after_queueing").exists():
        queue_one()
    (HERE / "hanging").write_text(str(n))
    while not (HERE / "release").exists():
        time.sleep(0.05)
print(queue_one())
"""

_SQUEUE = """
calls("squeue")
name = sys.argv[sys.argv.index("--name") + 1] if "--name" in sys.argv else None
user = sys.argv[sys.argv.index("--user") + 1] if "--user" in sys.argv else None
ending = HERE / "completing"
completing = set(ending.read_text().split()) if ending.exists() else set()
for job in jobs():
    if job["state"] not in ("PENDING", "RUNNING") or (name and job["name"] != name):
        continue  # ended: accounting's (sacct) alone
    if user and job["user"] != user:
        continue
    # USER_JOBS: %A|%F|%K|%j|%u|%T|%N|%r|%Z
    shown = "COMPLETING" if job["id"] in completing else job["state"]
    print("|".join((job["id"], job["id"], "0", job["name"], job["user"], shown,
                    job.get("nodes", "(null)"), "None", job["work_dir"])))
"""

_SCANCEL = """
calls("scancel")
doomed = set(sys.argv[1:])
def listed(name):
    path = HERE / name
    return set(path.read_text().split()) & doomed if path.exists() else set()
gone, kept, closing = listed("ended_before_cancel"), listed("refuse_cancel"), listed("completing")
save([{{**j, "state": "COMPLETED" if j["id"] in gone else "CANCELLED"}}
      if j["id"] in doomed - kept - closing else j for j in jobs()])
for job_id in sorted(gone | closing):
    print(f"scancel: error: Kill job error on job id {{job_id}}: Invalid job id specified",
          file=sys.stderr)
for job_id in sorted(kept):
    print(f"scancel: error: Kill job error on job id {{job_id}}: Access/permission denied",
          file=sys.stderr)
sys.exit(1 if gone or kept or closing else 0)
"""

_SACCT = """
calls("sacct")
def after(flag):
    return sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv else None
fields = after("--format").split(",")
user, name, ids = after("--user"), after("--name"), after("--jobs")
for job in jobs():
    if ids is not None and job["id"] not in ids.split(","):
        continue
    if ids is None and "--allusers" not in sys.argv and user and job["user"] != user:
        continue
    if name and job["name"] != name:
        continue
    known = {{"JobID": job["id"] + "_0", "JobIDRaw": job["id"], "JobName": job["name"],
             "User": job["user"], "State": job["state"], "WorkDir": job["work_dir"],
             "ExitCode": job.get("exit_code", "0:0"),
             "NodeList": job.get("nodes", "None assigned"), "Submit": job.get("submit", "Unknown"),
             "Start": job.get("start", "Unknown"), "End": job.get("end", "Unknown")}}
    print("|".join(known.get(f, "") for f in fields))
"""

_SCONTROL = """
calls("scontrol")
print("ClusterName = standin")
print("MaxArraySize = 1001")
"""


class SlurmStandin:
    """The stand-in's folder (put `bin` first on PATH) and what the queue holds."""

    def __init__(self, root: Path, user: str):
        self.root = root
        self.user = user
        self.bin = root / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        common = _COMMON.format(python=sys.executable, here=str(root))
        for name, body in (
            ("sbatch", _SBATCH),
            ("squeue", _SQUEUE),
            ("scancel", _SCANCEL),
            ("sacct", _SACCT),
            ("scontrol", _SCONTROL),
        ):
            path = self.bin / name
            path.write_text(common + body.format(user=user))
            path.chmod(0o755)

    def add(self, job_id: str, name: str, work_dir: str, state: str, **more: str) -> None:
        """A job already in the queue (or in accounting, once ended): `more` may give
        its user, nodes, start, end, submit and exit_code (sacct's N:M)."""
        queue = self.root / "queue.jsonl"
        job = {"id": job_id, "name": name, "work_dir": work_dir, "user": self.user}
        with queue.open("a") as fh:
            fh.write(json.dumps({**job, "state": state, **more}) + "\n")

    def update(self, job_id: str, **fields: str) -> None:
        """Change a queued job: its state, nodes, start, end, ... as Slurm would."""
        rows = [{**j, **fields} if j["id"] == job_id else j for j in self.jobs()]
        (self.root / "queue.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def steer(self, **files: str | int) -> None:
        for name, value in files.items():
            (self.root / name).write_text(str(value))

    def jobs(self) -> list[dict[str, str]]:
        queue = self.root / "queue.jsonl"
        if not queue.exists():
            return []
        return [json.loads(line) for line in queue.read_text().splitlines() if line]

    def live(self) -> list[str]:
        """The ids of the jobs still queued or running (neither cancelled nor ended)."""
        return [j["id"] for j in self.jobs() if j["state"] in ("PENDING", "RUNNING")]

    def calls(self, command: str) -> list[str]:
        log = self.root / "calls"
        lines = log.read_text().splitlines() if log.exists() else []
        return [line for line in lines if line.split(" ", 1)[0] == command]
