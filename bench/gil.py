"""The GIL a PyTorch training step costs other threads: adapm's tables against torch's own
(issue 29, the PyTorch path).

    python bench/gil.py             # about a minute here
    python bench/gil.py --quick     # a few seconds

One small sparse model, trained one batch after another in one thread: an EmbeddingBag of
``--ids`` rows x ``--dim`` (``--bag`` ids summed per example, ``--batch`` examples), a linear
head, BCE, AdaGrad on the table and SGD on the head, from the same data through a DataLoader
(in the training thread: ``num_workers=0``). Two ways:

- **torch**: ``nn.EmbeddingBag(sparse=True)`` and ``torch.optim.Adagrad``;
- **adapm**: ``adapm.torch.EmbeddingBag`` on one node and ``adapm.torch.optim.Adagrad``, the
  batches through ``IntentCollate`` and ``IntentLoader`` (intent, clock), as the README's
  script trains.

How much of the GIL a step holds cannot be read from outside, so a probe measures what it
costs: a second Python thread that only counts in a loop (it wants the GIL all the time) runs
alone for a while, then beside the training thread. The count it loses beside it is time
during which the GIL was not its own: the step's Python, plus each hand-over of the GIL
(a wake-up). Per step that is the **GIL cost**: how long a step keeps every other Python thread
of the process (another worker, the engine's loop) from running, an upper bound of the time
the step holds the GIL. The machine needs a core for each of the two threads (torch runs one
thread of its own: ``torch.set_num_threads(1)``). ``--repeat`` rounds alternate the two ways
and the probe alone; the table shows medians. ``sys.setswitchinterval`` is set to 50 us
(``--switch``) so that the training thread gets the GIL back soon after it asks: with Python's
default, 5 ms, each time a step takes the GIL back (torch lets go of it in every operator) it
waits up to that long for the probe to let go, and a 4 ms step took 360 ms beside it.

Columns: wall time per step alone and beside the probe; the GIL cost per step; that cost as a
share of the step alone (with a GIL cost share h, at most about 1 / h such threads can train at
once in one process).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402


def probe_rate(seconds: float, stop: threading.Event | None = None) -> tuple[float, float]:
    """Count in a loop for ``seconds`` (or until ``stop``): (counts per second, seconds)."""
    count, start = 0, time.perf_counter()
    end = start + seconds
    while True:
        for _ in range(1000):
            count += 1
        now = time.perf_counter()
        if now >= end or (stop is not None and stop.is_set()):
            return count / (now - start), now - start


def torch_step(opts, data):
    import torch

    # Torch's default, said out loud: its sparse Adagrad otherwise warns on every run that the
    # checks are "implicitly disabled" (checking them would slow the peer, not this bench).
    torch.sparse.check_sparse_tensor_invariants.disable()
    emb = torch.nn.EmbeddingBag(opts.ids, opts.dim, mode="sum", sparse=True)
    head = torch.nn.Linear(opts.dim, 1)
    opt_rows = torch.optim.Adagrad(emb.parameters(), lr=0.1)
    opt_dense = torch.optim.SGD(head.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(data, batch_size=opts.batch, shuffle=False)

    def batches():
        while True:
            yield from loader

    it = batches()

    def step():
        x, y = next(it)
        opt_rows.zero_grad()
        opt_dense.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(head(emb(x)).squeeze(1), y)
        loss.backward()
        opt_rows.step()
        opt_dense.step()

    return step, None


def adapm_step(opts, data):
    import torch

    import adapm
    from adapm.torch import EmbeddingBag, IntentCollate, IntentLoader, optim

    node = adapm.init(num_keys=opts.ids, value_length=2 * opts.dim)
    w = node.worker()
    model = torch.nn.ModuleDict({"emb": EmbeddingBag(opts.ids, opts.dim, mode="sum", worker=w),
                                 "head": torch.nn.Linear(opts.dim, 1)})
    opt_rows = optim.Adagrad(model, lr=0.1)
    opt_dense = torch.optim.SGD(model["head"].parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(
        data, batch_size=opts.batch, shuffle=False,
        collate_fn=IntentCollate(None, lambda batch: batch[0]))

    def batches():
        while True:
            yield from IntentLoader(loader, w, ahead=4)

    it = batches()

    def step():
        x, y = next(it)
        opt_rows.zero_grad()
        opt_dense.zero_grad()
        logits = model["head"](model["emb"](x)).squeeze(1)
        torch.nn.functional.binary_cross_entropy_with_logits(logits, y).backward()
        opt_rows.step()
        opt_dense.step()

    return step, node


def timed_steps(step, seconds: float) -> tuple[int, float]:
    """Steps for about ``seconds``: (steps, seconds)."""
    n, start = 0, time.perf_counter()
    while True:
        step()
        n += 1
        now = time.perf_counter()
        if now - start >= seconds:
            return n, now - start


def beside_probe(step, seconds: float) -> tuple[int, float, float]:
    """Steps for about ``seconds`` with the probe counting in another thread: (steps, seconds,
    the probe's counts per second meanwhile)."""
    stop, got = threading.Event(), {}

    def probe():
        got["rate"], _ = probe_rate(3600.0, stop)

    thread = threading.Thread(target=probe)
    thread.start()
    time.sleep(0.01)  # the probe runs
    try:
        n, took = timed_steps(step, seconds)
    finally:
        stop.set()
        thread.join()
    return n, took, got["rate"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short runs")
    p.add_argument("--ids", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--bag", type=int, default=20, help="ids per example")
    p.add_argument("--batch", type=int, default=256, help="examples per step")
    p.add_argument("--examples", type=int, default=100_000)
    p.add_argument("--seconds", type=float, default=None, help="per measurement (default 2)")
    p.add_argument("--repeat", type=int, default=None, help="rounds (default 5)")
    p.add_argument("--switch", type=float, default=0.00005,
                   help="sys.setswitchinterval in seconds (default 0.00005)")
    opts = p.parse_args()
    seconds = opts.seconds or (0.5 if opts.quick else 2.0)
    rounds = opts.repeat or (2 if opts.quick else 5)

    import torch

    torch.set_num_threads(1)
    sys.setswitchinterval(opts.switch)
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(0, opts.ids, (opts.examples, opts.bag)))
    labels = torch.from_numpy((rng.random(opts.examples) < 0.5).astype(np.float32))
    data = torch.utils.data.TensorDataset(ids, labels)
    ways = {"torch": torch_step(opts, data), "adapm": adapm_step(opts, data)}
    for step, _ in ways.values():  # warm up: first calls, caches, allocations
        timed_steps(step, 0.2)
    rows = {name: {"alone": [], "beside": [], "cost": []} for name in ways}
    try:
        for _ in range(rounds):
            for name, (step, _) in ways.items():
                alone_rate, _ = probe_rate(seconds)
                n, took = timed_steps(step, seconds)
                rows[name]["alone"].append(took / n)
                n, took, rate = beside_probe(step, seconds)
                rows[name]["beside"].append(took / n)
                # The probe's lost counts, as time, per step.
                rows[name]["cost"].append(max(0.0, 1.0 - rate / alone_rate) * took / n)
    finally:
        for _, node in ways.values():
            if node is not None:
                node.shutdown()

    print(f"machine: nproc={os.cpu_count()}, {platform.machine()}, python "
          f"{platform.python_version()}, torch {torch.__version__} (1 thread)")
    print(f"model: EmbeddingBag {opts.ids:,} x {opts.dim}, {opts.bag} ids per example, "
          f"{opts.batch} examples per step; {rounds} rounds of {seconds:g} s per measurement, "
          f"medians\n")
    print("| step | wall per step alone (us) | beside the probe (us) | GIL cost per step (us) "
          "| GIL cost / step alone |")
    print("|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        alone, beside, cost = (1e6 * statistics.median(r[k]) for k in ("alone", "beside", "cost"))
        label = ("torch: nn.EmbeddingBag(sparse=True), torch.optim.Adagrad" if name == "torch"
                 else "adapm: adapm.torch.EmbeddingBag, optim.Adagrad, IntentLoader (1 node)")
        print(f"| {label} | {alone:,.0f} | {beside:,.0f} | {cost:,.0f} | {cost / alone:.0%} |")


if __name__ == "__main__":
    main()
