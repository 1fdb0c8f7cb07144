"""Test support: run a function on N real node processes talking ZeroMQ on loopback.

    def job(node, n):            # module-level, so child processes can import it
        w = node.worker()
        ...
        return something_picklable

    results = run_cluster(job, world_size=3, args=(10,), timeout_s=60)

Every rank runs ``fn(node, *args)`` in its own process (spawned, so nothing is inherited by
accident), with a fresh rendezvous port. After ``fn`` returns, the child shuts its node down and
checks that no adapm thread is left running. The parent enforces a hard timeout, kills every
child on failure or timeout, and checks every exit code: any rank that fails, hangs or leaks
makes ``run_cluster`` raise :class:`ClusterFailure` with that rank's traceback.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
import traceback
from typing import Any, Callable, Optional, Sequence

from .errors import AdaPMError

_POLL_S = 0.05


class ClusterFailure(AdaPMError):
    """A rank of a test cluster failed, hung, leaked a thread or exited non-zero."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, outside the range the OS gives to sockets bound
    to port 0 and to outgoing connections (see ``adapm.launch.free_port``), so that the ranks'
    own sockets cannot take it before rank 0 binds it."""
    from .launch import free_port as launcher_free_port

    return launcher_free_port(host)


def listening(port: int) -> bool:
    """Whether a socket of this machine listens on TCP ``port``. Read from /proc, so that the
    check itself makes no connection (a node would count a probe as a failed handshake, or a
    rendezvous as a bad hello)."""
    suffix = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except OSError:
            continue
        if any(row[1].endswith(suffix) and row[3] == "0A" for row in rows):  # 0A: LISTEN
            return True
    return False


def rss_bytes() -> int:
    """This process's resident memory now (Linux: /proc/self/status), for tests that bound
    what a flood of messages may cost a node."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def run_cluster(fn: Callable, world_size: int, *, args: Sequence = (), timeout_s: float = 60.0,
                config: Optional[dict] = None, expect_failure: bool = False,
                restore: Optional[str] = None) -> list:
    """Run ``fn(node, *args)`` on ``world_size`` real processes; return their results by rank.

    ``config`` holds extra :class:`adapm.Config` fields (num_keys is required there).
    ``restore``: a checkpoint directory every node starts from (``adapm.init(restore=...)``).
    With ``expect_failure=True`` a failing rank does not raise; instead the list holds, per
    rank, ``("ok", result)`` or ``("error", traceback text)`` (a hang still raises).
    """
    ctx = mp.get_context("spawn")
    results_q = ctx.Queue()
    rendezvous = f"127.0.0.1:{free_port()}"
    settings = dict(config or {})
    procs = [
        ctx.Process(target=_child, name=f"adapm-test-rank-{rank}",
                    args=(fn, rank, world_size, rendezvous, settings, tuple(args), results_q,
                          restore))
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    outcome: dict[int, tuple[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(outcome) < world_size:
            try:
                rank, status, payload = results_q.get(timeout=_POLL_S)
                outcome[rank] = (status, payload)
                continue
            except queue.Empty:
                pass
            dead = [r for r, p in enumerate(procs) if r not in outcome and p.exitcode is not None]
            if dead:
                # A rank exited without reporting (crash, os._exit): give the queue a moment.
                time.sleep(0.2)
                while True:
                    try:
                        rank, status, payload = results_q.get_nowait()
                        outcome[rank] = (status, payload)
                    except queue.Empty:
                        break
                for r in dead:
                    if r not in outcome:
                        outcome[r] = ("error", f"rank {r} exited with code {procs[r].exitcode} "
                                               "without reporting a result")
            if time.monotonic() > deadline:
                hung = [r for r in range(world_size) if r not in outcome]
                raise ClusterFailure(f"ranks {hung} did not finish within {timeout_s:g}s "
                                     f"(finished: {sorted(outcome)})" + _describe(outcome))
        for rank, proc in enumerate(procs):
            proc.join(max(1.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                raise ClusterFailure(f"rank {rank} reported but did not exit" + _describe(outcome))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join()
        results_q.close()
        results_q.join_thread()
    failed = [r for r in range(world_size) if outcome[r][0] != "ok" or procs[r].exitcode != 0]
    if expect_failure:
        return [outcome[r] for r in range(world_size)]
    if failed:
        raise ClusterFailure(f"ranks {failed} failed (exit codes "
                             f"{[procs[r].exitcode for r in range(world_size)]})" + _describe(outcome))
    return [outcome[r][1] for r in range(world_size)]


def _describe(outcome: dict) -> str:
    parts = [f"\n--- rank {rank} ---\n{payload}" for rank, (status, payload) in
             sorted(outcome.items()) if status != "ok"]
    return "".join(parts)


def _child(fn, rank, world_size, rendezvous, settings, args, results_q, restore) -> None:
    import adapm

    status, payload, code = "ok", None, 0
    try:
        config = adapm.Config(rank=rank, world_size=world_size, rendezvous=rendezvous, **settings)
        node = adapm.init(config=config, restore=restore)
        try:
            payload = fn(node, *args)
        except BaseException:
            node._release()  # do not wait in shutdown for peers after a failure
            raise
        node.shutdown()
        leaked = [t.name for t in threading.enumerate() if t.name.startswith("adapm")]
        if leaked:
            raise ClusterFailure(f"rank {rank}: threads left running after shutdown: {leaked}")
    except BaseException:
        status, payload, code = "error", traceback.format_exc(), 1
    results_q.put((rank, status, payload))
    results_q.close()
    results_q.join_thread()
    raise SystemExit(code)
