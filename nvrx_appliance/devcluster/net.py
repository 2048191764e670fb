"""Network namespaces, veth pairs and the bridge that make one machine many hosts (shell)."""

from __future__ import annotations

import json
import subprocess

from nvrx_appliance.devcluster.plan import BRIDGE, NET_PREFIX, Host, Plan


class NetError(RuntimeError):
    pass


def ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def namespaces() -> set[str]:
    """Our network namespaces that exist (`ip netns list` prints 'NAME (id: N)')."""
    names = {line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()}
    return {n for n in names if n.startswith(NET_PREFIX)}


def links() -> dict[str, bool]:
    """Our root-namespace links (bridge and veth ends): name -> administratively up."""
    return {
        link["ifname"]: "UP" in link.get("flags", [])
        for link in json.loads(ip("-j", "link", "show") or "[]")
        if link["ifname"].startswith(NET_PREFIX)
    }


def foreign_routes() -> list[str]:
    """Destinations this machine routes other than through our bridge."""
    return [
        r["dst"]
        for r in json.loads(ip("-j", "route", "show") or "[]")
        if r.get("dev") != BRIDGE and "dst" in r
    ]


def _host(plan: Plan, host: Host) -> None:
    ns = host.netns
    ip("netns", "add", ns)
    # The peer is born inside the namespace as eth0, so no other name ever exists there.
    ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", ns)
    ip("link", "set", host.link, "master", BRIDGE, "up")
    ip("-n", ns, "addr", "add", f"{host.address}/{plan.prefixlen}", "dev", "eth0")
    ip("-n", ns, "link", "set", "eth0", "up")
    # Loopback: MariaDB listens on it, and torch's stores bind to it.
    ip("-n", ns, "link", "set", "lo", "up")


def create(plan: Plan) -> None:
    ip("link", "add", BRIDGE, "type", "bridge")
    ip("addr", "add", f"{plan.bridge_address}/{plan.prefixlen}", "dev", BRIDGE)
    ip("link", "set", BRIDGE, "up")
    for host in plan.hosts:
        _host(plan, host)


def set_link(host: Host, up: bool) -> None:
    ip("link", "set", host.link, "up" if up else "down")


def remove() -> None:
    """Delete every link and namespace of ours. Their processes must be gone first: a
    namespace that a process still holds outlives `ip netns del`, and its veth with it."""
    for name in links():
        if name != BRIDGE:
            ip("link", "del", name, check=False)
    for ns in namespaces():
        ip("netns", "del", ns, check=False)
    ip("link", "del", BRIDGE, check=False)
