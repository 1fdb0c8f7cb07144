"""Two nodes on two "hosts": network namespaces joined by a veth pair.

Nothing here may rely on one host: each rank runs in its own network namespace, with its own
loopback and one 10.199.x.y/30 address on a veth end, so the only way between the ranks is that
veth link. Each node must pick (via adapm._wire.rendezvous.resolve_host), bind and advertise its
namespace's address; a node that bound or advertised loopback could not be reached at all.
Off loopback authentication is on by default: both ranks get the same ADAPM_SECRET, and every
socket (rendezvous included) must be a CURVE socket.

The namespaces, the veth pair and the addresses exist only inside this test: the veth ends are
created directly in the namespaces (never in the host's), and both are deleted afterwards, also
when the test fails. Needs root and a working ``ip netns``; otherwise the test is skipped.
"""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.netns

RENDEZVOUS_PORT = 29471  # any port: the namespaces are fresh, nothing else listens there
JOB_TIMEOUT_S = 60
_ids = itertools.count()

# argv: my_ip. Environment: ADAPM_RANK, ADAPM_WORLD_SIZE, ADAPM_RENDEZVOUS (set by the test).
CHILD = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import adapm
    from adapm._wire import rendezvous

    my_ip = sys.argv[1]
    rank = int(os.environ["ADAPM_RANK"])
    N, L, REPS = 64, 4, 3

    config = adapm.Config.from_env(num_keys=N, value_length=L)
    assert config.authenticated, "off loopback, authentication must be on by default"
    chosen = rendezvous.resolve_host(config)
    assert chosen == my_ip, f"rank {rank}: resolve_host chose {chosen!r}, expected {my_ip!r}"
    node = adapm.init(config=config)
    address = node.transport.address
    assert my_ip in address, f"rank {rank}: advertises {address!r}, not {my_ip}"
    assert "127.0.0.1" not in address, f"rank {rank}: advertises loopback {address!r}"
    assert node.transport.router.curve_server, f"rank {rank}: its ROUTER is not a CURVE server"

    # Push only to keys homed on the other rank (home = k % 2): every update crosses the veth.
    w = node.worker()
    other = 1 - rank
    keys = np.arange(other, N, 2, dtype=np.int64)
    cols = np.arange(L, dtype=np.float32)
    for rep in range(REPS):
        updates = ((rank + 1) * 1000 + keys[:, None] + cols[None, :]).astype(np.float32)
        w.push(keys, updates)
        w.advance_clock()
    w.wait(30)
    node.barrier(30)

    values = w.pull(np.arange(N, dtype=np.int64))
    # Key k is pushed (REPS times) only by the rank that is not its home: 1 - k % 2.
    all_keys = np.arange(N)
    pusher = 1 - all_keys % 2
    expected = REPS * ((pusher + 1) * 1000 + all_keys)[:, None] + REPS * cols[None, :]
    np.testing.assert_array_equal(values, expected.astype(np.float32))
    stats = node.stats()
    assert stats["remote_push_keys"] == REPS * len(keys), stats
    assert stats["messages_sent"] > 0 and stats["messages_received"] > 0, stats
    node.shutdown(30)
    os.write(1, f"NETNS-OK rank={rank} address={address}\\n".encode())  # one write: shared stdout
    """
)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


@pytest.fixture
def netns_pair():
    """Two namespaces A and B joined by a veth pair; yields their names and addresses."""
    if os.geteuid() != 0:
        pytest.skip("netns test needs root (creates network namespaces)")
    if shutil.which("ip") is None:
        pytest.skip("netns test needs iproute2's `ip`")
    tag = f"{os.getpid()}-{next(_ids)}"
    ns_a, ns_b = f"adapm-a-{tag}", f"adapm-b-{tag}"
    # A private /30 that exists only inside these two namespaces.
    subnet = os.getpid() % 250
    ip_a, ip_b = f"10.199.{subnet}.1", f"10.199.{subnet}.2"
    created: list[str] = []

    def cleanup() -> None:
        for ns in reversed(created):
            _ip("netns", "del", ns, check=False)

    try:
        for ns in (ns_a, ns_b):
            proc = _ip("netns", "add", ns, check=False)
            if proc.returncode != 0:
                cleanup()
                pytest.skip(f"`ip netns add` does not work here: {proc.stderr.strip()}")
            created.append(ns)
        # Create both veth ends directly inside the namespaces: none appears on the host.
        proc = _ip("-n", ns_a, "link", "add", "veth-a", "type", "veth",
                   "peer", "name", "veth-b", "netns", ns_b, check=False)
        if proc.returncode != 0:
            cleanup()
            pytest.skip(f"cannot create a veth pair between namespaces: {proc.stderr.strip()}")
        for ns, dev, addr in ((ns_a, "veth-a", ip_a), (ns_b, "veth-b", ip_b)):
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
    except BaseException:
        cleanup()
        raise
    try:
        yield {"ns": (ns_a, ns_b), "ip": (ip_a, ip_b)}
    finally:
        cleanup()
        left = _ip("netns", "list", check=False).stdout
        assert ns_a not in left and ns_b not in left, f"namespaces left behind: {left}"


def _report(procs, outputs) -> str:
    return "\n".join(f"--- rank {r} (exit {p.returncode}) ---\n{outputs[r][0]}{outputs[r][1]}"
                     for r, p in enumerate(procs))


def test_two_nodes_in_two_namespaces(netns_pair, tmp_path):
    ns, ips = netns_pair["ns"], netns_pair["ip"]
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    secret = secrets.token_urlsafe(32)  # the job's, as adapm-run would make it
    procs = []
    try:
        for rank in (0, 1):
            env = dict(os.environ)
            for var in list(env):  # no other launcher's variables may leak in
                if var.startswith(("ADAPM_", "OMPI_", "PMI_", "SLURM_")) or var in (
                        "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                    del env[var]
            env.update(ADAPM_RANK=str(rank), ADAPM_WORLD_SIZE="2",
                       ADAPM_RENDEZVOUS=f"{ips[0]}:{RENDEZVOUS_PORT}",
                       ADAPM_CONNECT_TIMEOUT_S="30", ADAPM_REQUEST_TIMEOUT_S="30",
                       ADAPM_SECRET=secret)
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns[rank], sys.executable, str(script), ips[rank]],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                cwd=tmp_path))
        outputs: dict[int, tuple[str, str]] = {}
        hung = None
        deadline = time.monotonic() + JOB_TIMEOUT_S  # one deadline for the whole job
        for rank, proc in enumerate(procs):
            try:
                outputs[rank] = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung = rank
                break
        if hung is not None:
            for proc in procs:
                proc.kill()
            for rank, proc in enumerate(procs):
                if rank not in outputs:
                    outputs[rank] = proc.communicate()
            pytest.fail(f"rank {hung} did not finish within {JOB_TIMEOUT_S}s (both killed)\n"
                        + _report(procs, outputs))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    report = _report(procs, outputs)
    assert [p.returncode for p in procs] == [0, 0], report
    for rank in (0, 1):
        assert f"NETNS-OK rank={rank} address=tcp://{ips[rank]}:" in outputs[rank][0], report
