"""Thin adapters to this node: `nvidia-smi -q`, and the names this node answers to."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Mapping

from nvrx_appliance.node import detect

# NVRx itself gives nvidia-smi 10 s; a node whose driver hangs longer than that would
# fail NVRx's own query too, so it has no usable ClusterUUID either way.
NVIDIA_SMI_TIMEOUT_S = 10.0


def node_fabric(timeout: float = NVIDIA_SMI_TIMEOUT_S) -> detect.Fabric:
    """This node's ClusterUUID verdict; any failure of nvidia-smi means none."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return detect.unavailable("nvidia-smi is not on PATH (no NVIDIA driver here?)")
    try:
        # Its own session, so a hang is killed with everything it started; otherwise a
        # grandchild holding the pipe would keep us waiting past the timeout.
        child = subprocess.Popen(
            [binary, "-q"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except OSError as exc:
        return detect.unavailable(f"nvidia-smi could not be started: {exc.strerror}")
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return detect.unavailable(f"nvidia-smi -q did not answer within {timeout:.0f} s")
    if child.returncode != 0:
        first = (err or out).strip().splitlines()[:1]
        detail = f": {first[0]}" if first else ""
        return detect.unavailable(f"nvidia-smi -q exited {child.returncode}{detail}")
    return detect.fabric(detect.parse(out))


def own_names(env: Mapping[str, str]) -> frozenset[str]:
    """Host names and addresses that would make a rendezvous endpoint mean this node."""
    raw = {socket.gethostname(), env.get("SLURMD_NODENAME", "")}
    with contextlib.suppress(OSError):
        raw.add(socket.getfqdn())
    names = {n.rstrip(".").lower() for n in raw if n}
    names |= {n.split(".")[0] for n in names}
    addresses: set[str] = set()
    for name in names:
        try:
            addresses |= {str(info[4][0]) for info in socket.getaddrinfo(name, None)}
        except OSError:
            continue
    return frozenset(names | addresses)


def detect_report() -> dict:
    """What `nvrx-entrypoint detect` shows: this node's GPUs, their ClusterUUID, and the
    segment decision `auto` would take here."""
    fabric = node_fabric()
    auto = detect.decide("auto", fabric)
    return {
        "hostname": socket.gethostname(),
        "gpus": [
            {"bus_id": g.bus_id, "name": g.name, "uuid": g.uuid, "cluster_uuid": g.cluster_uuid}
            for g in fabric.gpus
        ],
        "cluster_uuid": fabric.cluster_uuid,
        "reason": fabric.reason,
        "auto_segment": auto.segment,
        "auto_reason": auto.reason,
    }
