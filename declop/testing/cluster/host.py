"""The host state a local node changes outside its private folder: recorded, compared, restored.

:meth:`HostState.record` reads, before a node starts, everything :mod:`declop.testing.cluster.node`'s
parts change on the host; :meth:`HostState.restore` puts back exactly what changed since and
:meth:`HostState.difference` lists what still differs. Invariants: nothing that existed before
the record is removed or rewritten (someone else's iptables rules, files and mounts are never
touched), and every step is idempotent, so an interrupted restore can be run again. A
:class:`HostState` round-trips through JSON (:meth:`HostState.to_json`, :meth:`HostState.from_json`),
so a run record (:mod:`declop.testing.cluster.runrecord`) can carry it to the run that cleans up after a
killed one.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["BRIDGE", "HOST_PATHS", "SYSCTLS", "HostState", "Rules", "bridge_ports"]

#: the CNI bridge a local node's Pods hang off (created by the bridge plugin, deleted on stop)
BRIDGE = "declop0"
# Folders kubelet, containerd and libcni use whatever their configuration says.
HOST_PATHS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/run/containerd",
)
# Kernel settings kubelet, kube-proxy and the CNI bridge change; restored on stop.
SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


@dataclass
class HostState:
    """What the host looked like before the node started, to put it back afterwards."""

    bridge: str
    bridge_existed: bool
    sysctls: dict[str, str]
    paths: dict[str, set[str] | None]
    mounts: set[str]
    iptables: dict[str, Rules] = field(default_factory=dict)
    nft_tables: set[str] = field(default_factory=set)

    @classmethod
    def record(cls, bridge: str) -> HostState:
        return cls(
            bridge=bridge,
            bridge_existed=Path(f"/sys/class/net/{bridge}").exists(),
            sysctls={name: read_sysctl(name) for name in SYSCTLS if read_sysctl(name)},
            paths={path: tree(path) for path in HOST_PATHS},
            mounts=set(mount_points()),
            iptables={tool: Rules.save(tool) for tool in ("iptables", "ip6tables")},
            nft_tables=nft_tables(),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "bridge": self.bridge,
            "bridge_existed": self.bridge_existed,
            "sysctls": self.sysctls,
            "paths": {path: None if was is None else sorted(was) for path, was in self.paths.items()},
            "mounts": sorted(self.mounts),
            "iptables": {
                tool: {table: [sorted(chains), rules] for table, (chains, rules) in r.tables.items()}
                for tool, r in self.iptables.items()
            },
            "nft_tables": sorted(self.nft_tables),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostState:
        """The inverse of :meth:`to_json`; ``KeyError``/``TypeError``/``ValueError`` if malformed."""
        return cls(
            bridge=str(data["bridge"]),
            bridge_existed=bool(data["bridge_existed"]),
            sysctls={str(k): str(v) for k, v in data["sysctls"].items()},
            paths={str(k): None if v is None else set(v) for k, v in data["paths"].items()},
            mounts=set(data["mounts"]),
            iptables={
                tool: Rules({table: (set(chains), list(rules)) for table, (chains, rules) in tables.items()})
                for tool, tables in data["iptables"].items()
            },
            nft_tables=set(data["nft_tables"]),
        )

    def restore(self, private: Path | None, cgroup_root: str) -> None:
        for mount in self._new_mounts(str(private or "")):
            umount(mount)
        if cgroup_root:
            remove_cgroups(cgroup_root)
        for tool, before in self.iptables.items():
            before.restore_into(tool)
        for table in nft_tables() - self.nft_tables:  # iptables-nft made it: drop it whole
            subprocess.run(["nft", "delete", "table", *table.split()], capture_output=True, check=False)
        if not self.bridge_existed and Path(f"/sys/class/net/{self.bridge}").exists():
            for port in bridge_ports(self.bridge):  # the host ends of Pods' veths: ours, as the bridge is
                subprocess.run(["ip", "link", "delete", port], capture_output=True, check=False)
            subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, check=False)
        for name, value in self.sysctls.items():
            if read_sysctl(name) != value:
                write_sysctl(name, value)
        for path, was in self.paths.items():
            restore_tree(path, was)

    def difference(self, private: str, cgroup_root: str) -> list[str]:
        """Human-readable list of what differs from the recorded state."""
        found = [f"mount {m}" for m in self._new_mounts(private)]
        if cgroup_root:
            found += [
                f"cgroup {h / cgroup_root.lstrip('/')}"
                for h in cgroup_hierarchies()
                if (h / cgroup_root.lstrip("/")).exists()
            ]
        found += [f"nftables table {t}" for t in sorted(nft_tables() - self.nft_tables)]
        for tool, before in self.iptables.items():
            found += before.difference(tool)
        if not self.bridge_existed and Path(f"/sys/class/net/{self.bridge}").exists():
            found += [f"interface {port}" for port in bridge_ports(self.bridge)]
            found.append(f"interface {self.bridge}")
        found += [
            f"sysctl {name}={read_sysctl(name)} (was {value})"
            for name, value in self.sysctls.items()
            if read_sysctl(name) != value
        ]
        for path, was in self.paths.items():
            now = tree(path)
            if was is None and now is not None:
                found.append(f"path {path}")
            elif was is not None:
                found += [f"path {extra}" for extra in sorted((now or set()) - was)]
        return found

    def _new_mounts(self, private: str) -> list[str]:
        roots = [r.rstrip("/") for r in (private, *HOST_PATHS) if r]
        return [
            m
            for m in sorted(set(mount_points()) - self.mounts, reverse=True)
            if any(m == r or m.startswith(r + "/") for r in roots)
        ]


@dataclass
class Rules:
    """``iptables-save`` of one family: table → (user chains, rules as ``-A ...`` lines).

    Built-in chains (those with a policy) are not listed: they cannot be deleted, and a table
    that iptables-nft created whole is dropped as an nftables table instead.
    """

    tables: dict[str, tuple[set[str], list[str]]]

    @classmethod
    def save(cls, tool: str) -> Rules:
        result = subprocess.run(
            [f"{tool}-save"], capture_output=True, text=True, check=False
        )
        tables: dict[str, tuple[set[str], list[str]]] = {}
        chains: set[str] = set()
        rules: list[str] = []
        for line in result.stdout.splitlines():
            if line.startswith("*"):
                chains, rules = set(), []
                tables[line[1:]] = (chains, rules)
            elif line.startswith(":"):
                name, policy = line[1:].split()[:2]
                if policy == "-":
                    chains.add(name)
            elif line.startswith("-A "):
                rules.append(line)
        return cls(tables)

    def restore_into(self, tool: str) -> None:
        """Delete the rules and chains that appeared since this snapshot; keep everything else."""
        now = Rules.save(tool)
        for table, (chains, rules) in now.tables.items():
            old_chains, old_rules = self.tables.get(table, (set(), []))
            new_chains = sorted(chains - old_chains)
            for rule in rules:
                if rule not in old_rules and rule.split()[1] not in new_chains:
                    delete = ["-D", *shlex.split(rule)[1:]]
                    subprocess.run([tool, "-w", "-t", table, *delete], capture_output=True, check=False)
            for chain in new_chains:
                subprocess.run([tool, "-w", "-t", table, "-F", chain], capture_output=True, check=False)
            for chain in new_chains:
                subprocess.run([tool, "-w", "-t", table, "-X", chain], capture_output=True, check=False)

    def difference(self, tool: str) -> list[str]:
        now = Rules.save(tool)
        extra: list[str] = []
        for table, (chains, rules) in now.tables.items():
            old_chains, old_rules = self.tables.get(table, (set(), []))
            extra += [f"{tool} {table} chain {c}" for c in sorted(chains - old_chains)]
            extra += [f"{tool} {table} {r}" for r in rules if r not in old_rules]
        return extra


def bridge_ports(bridge: str) -> list[str]:
    """The interfaces enslaved to ``bridge`` (none when it does not exist)."""
    try:
        return sorted(p.name for p in Path(f"/sys/class/net/{bridge}/brif").iterdir())
    except OSError:
        return []


def nft_tables() -> set[str]:
    """``family name`` of every nftables table (iptables-nft keeps its tables there)."""
    out = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False)
    return {line.split(None, 1)[1] for line in out.stdout.splitlines() if line.startswith("table ")}


def cgroup_hierarchies() -> list[Path]:
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():  # cgroup v2 only
        return [base]
    return [d for d in base.iterdir() if d.is_dir() and not d.is_symlink()]


def cgroup_pids(root: str) -> set[int]:
    pids: set[int] = set()
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / root.lstrip("/")
        if not top.is_dir():
            continue
        for folder, _, _ in os.walk(top):
            try:
                text = (Path(folder) / "cgroup.procs").read_text()
            except OSError:
                continue
            pids.update(int(p) for p in text.split())
    return pids


def make_cgroups(root: str) -> None:
    """Create ``root`` in every hierarchy (kubelet wants its cgroupRoot to exist)."""
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / root.lstrip("/")
        top.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):  # a v1 cpuset child starts empty
            parent = hierarchy / name
            if parent.exists() and not (top / name).read_text().strip():
                (top / name).write_text(parent.read_text())


def remove_cgroups(root: str) -> None:
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / root.lstrip("/")
        if not top.is_dir():
            continue
        for folder, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
            try:
                os.rmdir(folder)
            except OSError:
                pass


def mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            points.append(line.split()[4].replace("\\040", " "))
    return points


def umount(path: str) -> None:
    subprocess.run(["umount", "--lazy", path], capture_output=True, check=False)


def unmount_under(folder: Path) -> None:
    prefix = str(folder).rstrip("/") + "/"
    for mount in sorted(mount_points(), reverse=True):
        if mount.startswith(prefix):
            umount(mount)


def tree(path: str) -> set[str] | None:
    if not os.path.lexists(path):
        return None
    found = {path}
    for folder, dirs, files in os.walk(path):
        found.update(os.path.join(folder, n) for n in (*dirs, *files))
    return found


def restore_tree(path: str, before: set[str] | None) -> None:
    if before is None:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)
        return
    now = tree(path) or set()
    for extra in sorted(now - before, key=len, reverse=True):
        if os.path.isdir(extra) and not os.path.islink(extra):
            shutil.rmtree(extra, ignore_errors=True)
        else:
            try:
                os.unlink(extra)
            except OSError:
                pass


def read_sysctl(name: str) -> str:
    try:
        return Path("/proc/sys", name).read_text().strip()
    except OSError:
        return ""


def write_sysctl(name: str, value: str) -> None:
    try:
        Path("/proc/sys", name).write_text(value + "\n")
    except OSError:
        pass

