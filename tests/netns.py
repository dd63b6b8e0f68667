"""Two nodes on one machine: each in its own UTS namespace (its own host name) and, where
network namespaces and a rate limit can be set up (as root, with iproute2), its own network
namespace joined to the other by a veth pair limited by ``tc ... tbf``: ranks of one node talk
over its loopback, ranks of different nodes over the slow link, as on a cluster. Used by the
two-node test and by the what-if validation of a faster link."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _run(*cmd, check=True) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=60,
                          check=check)


class Network:
    """Two network namespaces joined by a veth pair limited to ``rate_mbit`` Mbit/s, or nothing
    (``ok`` False, ``why`` says why). ``close()`` removes them."""

    def __init__(self, rate_mbit: float = 20) -> None:
        k = os.getpid() % 200 + 20
        self.ns = [f"pdt{k}a", f"pdt{k}b"]
        self.dev = [f"pdt{k}v0", f"pdt{k}v1"]
        self.addr = [f"10.213.{k}.1", f"10.213.{k}.2"]
        self.rate_mbit = rate_mbit
        self.ok, self.why = False, ""
        if not (shutil.which("ip") and shutil.which("tc")):
            self.why = "no ip/tc (iproute2)"
            return
        try:
            for ns in self.ns:
                _run("ip", "netns", "add", ns)
                _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "link", "add", self.dev[0], "type", "veth", "peer", "name", self.dev[1])
            for ns, dev, addr in zip(self.ns, self.dev, self.addr):
                _run("ip", "link", "set", dev, "netns", ns)
                _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                _run("ip", "-n", ns, "link", "set", dev, "up")
                _run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                     f"{rate_mbit:g}mbit", "burst", "32kbit", "latency", "400ms")
            self.ok = True
        except (subprocess.CalledProcessError, OSError) as exc:
            err = getattr(exc, "stderr", "") or str(exc)
            last = err.strip().splitlines()[-1] if err else str(exc)
            self.why = f"network namespaces refused ({last})"
            self.close()

    def prefix(self, node: int) -> list[str]:
        """The command prefix that runs a command in ``node``'s network namespace."""
        return ["ip", "netns", "exec", self.ns[node]] if self.ok else []

    def close(self) -> None:
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def uts_refused() -> str | None:
    """Why a node cannot get its own host name here (``unshare --uts``), or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root for unshare --uts"
    if not shutil.which("unshare"):
        return "no unshare (util-linux)"
    res = subprocess.run(["unshare", "--uts", "hostname", "pardiag-probe"], capture_output=True,
                         text=True)
    if res.returncode != 0:
        return f"unshare --uts refused: {res.stderr.strip()[:200]}"
    return None


def run_two_nodes(net: Network, launch: list[str], cwd: Path, timeout: float = 300,
                  ) -> tuple[list[int], list[tuple[str, str]]]:
    """Run ``launch`` (:func:`profile_command` or :func:`torchrun_command`: its ``{node}`` and
    ``{endpoint}`` filled in per node) once per node, node ``n`` named ``node<n>`` in its own
    namespaces, the rendezvous on node 0. Returns the exit codes and each node's (stdout,
    stderr)."""
    host = net.addr[0] if net.ok else "127.0.0.1"
    endpoint = f"{host}:{free_port('127.0.0.1')}"
    procs = []
    try:
        for node in (0, 1):
            env = {**os.environ, "GLOO_SOCKET_IFNAME": net.dev[node] if net.ok else "lo"}
            cmd = [*net.prefix(node), "unshare", "--uts", "sh", "-c",
                   f'hostname node{node} && exec "$@"', "sh",
                   *[a.format(node=node, endpoint=endpoint) for a in launch]]
            procs.append(subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        results = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [p.returncode for p in procs], results


def profile_command(script: Path, n: int, out: Path, *script_args: str,
                    timeout_s: int = 240) -> list[str]:
    """``pardiag profile`` of ``script`` as one node of two (``n`` ranks per node) writing to
    ``out``; placeholders for :func:`run_two_nodes`."""
    return [sys.executable, "-m", "pardiag", "profile", str(script), "--nproc-per-node", str(n),
            "--nnodes", "2", "--node-rank", "{node}", "--rdzv-endpoint", "{endpoint}", "--out",
            str(out), "--timeout", str(timeout_s), "--", *script_args]


def torchrun_command(script: Path, n: int, *script_args: str) -> list[str]:
    """Plain ``torchrun`` of ``script`` as one node of two (its static rendezvous, as
    ``pardiag profile`` uses); placeholders for :func:`run_two_nodes`."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}",
            "--nnodes=2", "--node-rank={node}", "--rdzv-endpoint={endpoint}", str(script),
            *script_args]
