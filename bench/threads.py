"""Worker threads of one process: epoch time, worker CPU and GIL-held time per batch (issue 29).

    python bench/threads.py --quick          # small data, about 2 minutes
    python bench/threads.py                  # larger data (the table in docs/benchmarks.md)
    python bench/threads.py --apps mf --threads 1,2,4 --repeat 3
    python bench/threads.py --quick --compare /tmp/before   # another checkout, side by side

``--compare DIR``: every setup also runs with the adapm of DIR (a checkout with its native
extensions built in place: ``python -c "from setuptools import setup; setup()" build_ext
--inplace``), the two alternating in each round, so that a before/after comparison shares one
sitting of a noisy machine. ``--tree DIR`` runs "this" side from checkout DIR too (a snapshot
that others' edits of the working tree cannot change during the run).

For each app (MF, WV, KGE on their generated data) and each setup (``--baseline``: the kernels
over a plain shared array; ``adapm``: one PM node, the app without a launcher) with 1 and 2
worker threads (``--threads``), one run of the app in a child process that measures from
inside:

- epoch (s): the app's ``train_seconds``, mean over the epochs;
- worker CPU / batch (us): the thread CPU clock (``time.thread_time``) of every worker thread
  over its epoch (schedule, intent, plans, steps, ``wait_sync``), summed over threads and
  epochs, over the batches trained. The same work with more threads should cost the same CPU;
  more CPU is contention (the GIL's hand-overs, shared cache lines, lock stripes);
- native / batch (us): the part of it spent inside the project's native calls that release the
  GIL (the kernels' ``*_train_batch``, ``mf_train_table`` and ``mf_train_rows`` (many MF
  batches a call over the baseline's array and over one node's store), ``kge_train_table`` and
  ``kge_train_rows`` (the same for KGE), ``wv_train_table``, ``wv_train_rows`` and
  ``wv_plan_run`` (WV's runs: a call plans a run's batches, one trains them), ``mf_plan``,
  ``wv_plan``, ``wv_merge_pool``, the
  ``table_gather`` / ``table_scatter_add``, the store's ``gather_fast`` /
  ``scatter_*_fast``, and the store module's ``unique_inverse`` (KGE's plan), ``gather`` /
  ``scatter_*`` when their batch is large enough to release it: see RELEASE_GIL_FROM);
- schedule / batch (us): the part spent in the task's per-epoch ``epoch_order`` and
  ``standing_keys`` (MF), over the batches: numpy's work on whole arrays (sorts, fancy
  indexing, random draws of an epoch's points), which releases the GIL inside (measured: a
  Python thread runs at 99-100% of its own speed beside an argsort, a fancy index or an
  ``rng.integers`` of 1.8M items);
- GIL-held* / batch (us): worker CPU outside those calls and the schedule: the thread's Python
  path per batch (batch slicing, intent, plan, pull/push wrappers, counters), which holds the
  GIL. Not exact either way: numpy releases the GIL inside its sorts and takes even on small
  arrays (np.unique of 2,000 keys), which this counts as held, and the native calls check their
  arguments before they release the GIL, which this counts as released (~1-3 us a call). A
  py-spy ``--gil`` sample is the cross-check (docs/benchmarks.md). With a GIL-held share h of
  a batch, at most about 1 / h threads can run at once;
- wall / batch (us): the worker threads' wall time over the batches (all threads' summed):
  above the CPU when a thread waits (for the GIL, a core of a busy machine);
- off-CPU outside native / batch (us): wall time outside those calls and the schedule minus
  its CPU: waiting for the GIL (or descheduled by the OS, on a shared machine).

``--breakdown`` adds a table of each native call's CPU and wall time per batch (the bracket's
cost included), which shows where native time grows with threads (a shared lock stripe, a
shared cache line) and how many GIL-releasing calls a batch makes.

Each native call of a worker thread is bracketed by two ``thread_time`` and two
``perf_counter`` reads in the child; the cost of that instrumentation, measured in the child
before the run (a wrapped no-op), is taken out of the figures. Every setup of an app runs on
the same data, one after the other; with ``--repeat`` the rounds alternate setups and the table
shows each setup's median round (by worker CPU per batch). OMP_WAIT_POLICY=PASSIVE.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
HERE = Path(__file__).resolve()

# native/module.h RELEASE_GIL_FROM: Store.gather/scatter_* release the GIL only for batches of
# at least this many keys + floats (the *_fast calls always do).
RELEASE_GIL_FROM = 32768

# Data per app: the generator's arguments, quick and full.
SIZES = {
    "mf": {"quick": ["--rows", "20000", "--cols", "5000", "--entries", "2000000"],
           "full": ["--rows", "200000", "--cols", "50000", "--entries", "11000000"]},
    "wv": {"quick": ["--sentences", "50000"], "full": ["--sentences", "250000"]},
    "kge": {"quick": ["--triples", "100000"], "full": ["--triples", "500000"]},
}


# --- the child: one app run, instrumented -----------------------------------------------------

def child(app: str, argv: list[str]) -> None:
    """Run ``python -m adapm.apps.<app> argv`` in this process with every GIL-releasing native
    call of the worker threads timed; then print one ``THREADS {...}`` line with the
    measurements (the app's own JSON lines go where its ``--json`` says)."""
    import importlib
    import threading

    import adapm._store as store_module
    from adapm._native_loader import load
    from adapm.apps import runner

    kernels = load("adapm._kernels")
    module = importlib.import_module(f"adapm.apps.{app}")
    local = threading.local()
    records: list[dict] = []  # one per worker thread and epoch
    thread_time, perf_counter = time.thread_time, time.perf_counter

    def timed(fn, batch=False, releases=None, name: str = "noop"):
        """fn, with its CPU and wall time added to the calling worker thread's record (only
        when the call releases the GIL: ``releases(*args)`` says, default always), and to the
        record's per-call-name part (``name``: CPU, wall, calls). ``batch``: the call trains
        one batch (True) or as many as ``batch(result)`` says."""
        def call(*args, **kwargs):
            rec = getattr(local, "rec", None)
            if rec is None or (releases is not None and not releases(*args)):
                return fn(*args, **kwargs)
            c, w = thread_time(), perf_counter()
            out = fn(*args, **kwargs)
            dc, dw = thread_time() - c, perf_counter() - w
            rec[0] += dc
            rec[1] += dw
            rec[2] += 1
            if batch:
                rec[3] += 1 if batch is True else batch(out)
            part = rec[6].get(name)
            if part is None:
                part = rec[6][name] = [0.0, 0.0, 0]
            part[0] += dc
            part[1] += dw
            part[2] += 1
            return out
        return call

    for name in ("mf_train_batch", "kge_train_batch", "wv_train_batch"):
        setattr(kernels, name, timed(getattr(kernels, name), batch=True, name=name))
    if hasattr(kernels, "mf_train_table"):  # many MF batches a call over the baseline's array
        kernels.mf_train_table = timed(kernels.mf_train_table, batch=lambda n: n,
                                       name="mf_train_table")
    if hasattr(kernels, "mf_train_rows"):  # the same over one node's store
        kernels.mf_train_rows = timed(kernels.mf_train_rows, batch=lambda out: out[0],
                                      name="mf_train_rows")
    if hasattr(kernels, "kge_train_table"):  # many KGE batches a call: the array, a store
        kernels.kge_train_table = timed(kernels.kge_train_table, batch=lambda n: n,
                                        name="kge_train_table")
        kernels.kge_train_rows = timed(kernels.kge_train_rows, batch=lambda out: out[0],
                                       name="kge_train_rows")
    if hasattr(kernels, "wv_train_table"):  # many WV batches a call: the array, a store
        kernels.wv_train_table = timed(kernels.wv_train_table, batch=lambda n: n,
                                       name="wv_train_table")
        kernels.wv_train_rows = timed(kernels.wv_train_rows, batch=lambda out: out[0],
                                      name="wv_train_rows")
    for name in ("mf_plan", "wv_plan", "wv_plan_run", "wv_merge_pool", "table_gather",
                 "table_scatter_add"):
        if hasattr(kernels, name):  # a --compare checkout may not have them all
            setattr(kernels, name, timed(getattr(kernels, name), name=name))

    native = load()
    if hasattr(native, "unique_inverse"):  # KGE's plan (O(n); releases the GIL only for
        # RELEASE_GIL_FROM keys or more since session 30, as the store's gather and scatter)
        native.unique_inverse = timed(native.unique_inverse, name="unique_inverse",
                                      releases=lambda keys, *_: len(keys) >= RELEASE_GIL_FROM)

    def big(keys, values, missing) -> bool:
        return len(keys) + values.size >= RELEASE_GIL_FROM

    store_init = store_module.Store.__init__

    def init(self, config) -> None:
        store_init(self, config)
        for name in ("gather_fast", "scatter_add_fast", "scatter_set_fast"):
            setattr(self, name, timed(getattr(self, name), name=name))

    store_module.Store.__init__ = init
    for name in ("gather", "scatter_add", "scatter_set"):
        method = getattr(store_module.Store, name)
        setattr(store_module.Store, name,
                timed(method, releases=lambda self, k, v, m: big(k, v, m), name=name))

    def scheduled(fn):
        """fn (a task's epoch_order or standing_keys), its CPU and wall time added to the
        worker thread's schedule time."""
        def call(*args, **kwargs):
            rec = getattr(local, "rec", None)
            if rec is None:
                return fn(*args, **kwargs)
            c, w = thread_time(), perf_counter()
            out = fn(*args, **kwargs)
            rec[4] += thread_time() - c
            rec[5] += perf_counter() - w
            return out
        return call

    for task_class in [v for v in vars(module).values() if isinstance(v, type)]:
        for name in ("epoch_order", "standing_keys"):
            if name in vars(task_class):
                setattr(task_class, name, scheduled(vars(task_class)[name]))

    run_epoch = runner._Thread._run_epoch

    def measured(self, epoch: int, ahead: int) -> None:
        # native CPU, native wall, native calls, batches, schedule CPU, schedule wall
        rec = local.rec = [0.0, 0.0, 0, 0, 0.0, 0.0, {}]
        c, w = thread_time(), perf_counter()
        try:
            run_epoch(self, epoch, ahead)
        finally:
            cpu, wall = thread_time() - c, perf_counter() - w
            local.rec = None
            records.append({"epoch": epoch, "cpu": cpu, "wall": wall, "native_cpu": rec[0],
                            "native_wall": rec[1], "calls": rec[2], "batches": rec[3],
                            "schedule_cpu": rec[4], "schedule_wall": rec[5], "by_call": rec[6]})

    runner._Thread._run_epoch = measured
    overhead = _calibrate(timed, local)
    module.main(argv)
    sys.stdout.flush()
    print("THREADS " + json.dumps({"records": records, "overhead": overhead}), flush=True)


def _calibrate(timed, local) -> dict:
    """CPU seconds one timed call adds in all (``total``) and outside its bracket (``held``):
    a wrapped no-op against the bare one, best of a few rounds."""
    import threading

    result = {}

    def measure() -> None:
        noop = len
        wrapped = timed(noop)
        arg, n, best_total, best_inside = (), 20000, float("inf"), float("inf")
        for _ in range(5):
            local.rec = [0.0, 0.0, 0, 0, 0.0, 0.0, {}]
            c = time.thread_time()
            for _ in range(n):
                wrapped(arg)
            wrapped_cpu = time.thread_time() - c
            inside = local.rec[0]
            c = time.thread_time()
            for _ in range(n):
                noop(arg)
            bare = time.thread_time() - c
            best_total = min(best_total, (wrapped_cpu - bare) / n)
            best_inside = min(best_inside, inside / n)
        local.rec = None
        result["total"] = best_total
        result["held"] = max(0.0, best_total - best_inside)

    t = threading.Thread(target=measure)
    t.start()
    t.join()
    return result


# --- the parent: runs and table ---------------------------------------------------------------

def generate(app: str, size: str, env: dict) -> Path:
    gen = SIZES[app][size]
    data = Path(tempfile.gettempdir()) / f"adapm-bench-threads-{app}-{'-'.join(gen[1::2])}"
    marker = {"mf": "test.mmc", "wv": "corpus.txt", "kge": "train.txt"}[app]
    if not (data / marker).exists():
        subprocess.run([PY, "-m", f"adapm.apps.{app}", "generate", str(data), *gen, "--seed",
                        "1"], env=env, check=True, capture_output=True)
    return data


def app_args(app: str, data: Path, epochs: int) -> list[str]:
    common = ["--epochs", str(epochs), "--progress", "off", "--seed", "1"]
    if app == "mf":
        return ["--train", str(data / "train.mmc"), "--test", str(data / "test.mmc"), *common]
    if app == "wv":
        return ["--corpus", str(data / "corpus.txt"), "--eval-every", "0", *common]
    return ["--data", str(data), "--eval-every", "0", "--eval-max", "200", *common]


def run_one(app: str, args: list[str], env: dict, tree: str | None = None) -> dict:
    """One child run (with the adapm of checkout ``tree`` if given): its figures per batch
    (seconds)."""
    started = time.monotonic()
    if tree:
        env = {**env, "PYTHONPATH": tree}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "epochs.jsonl"  # the app's JSON lines (--json FILE appends them)
        proc = subprocess.run([PY, str(HERE), "--child", app, *args, "--json", str(out)],
                              env=env, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"failed ({proc.returncode}): {app} {' '.join(args)}\n"
                     f"{proc.stderr[-4000:]}")
        lines = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    meta = next(json.loads(line[len("THREADS "):]) for line in proc.stdout.splitlines()
                if line.startswith("THREADS "))
    recs, over = meta["records"], meta["overhead"]
    batches = sum(r["batches"] for r in recs)
    calls = sum(r["calls"] for r in recs)
    cpu = sum(r["cpu"] for r in recs) - calls * over["total"]
    native = sum(r["native_cpu"] for r in recs)
    schedule = sum(r.get("schedule_cpu", 0.0) for r in recs)
    held = sum(r["cpu"] - r["native_cpu"] for r in recs) - schedule - calls * over["held"]
    outside_wall = sum(r["wall"] - r["native_wall"] - r.get("schedule_wall", 0.0) for r in recs)
    outside_cpu = sum(r["cpu"] - r["native_cpu"] - r.get("schedule_cpu", 0.0) for r in recs)
    print(f"  {time.monotonic() - started:6.1f} s  {app} {' '.join(args[-6:])}"
          f"{' (' + tree + ')' if tree else ''}", file=sys.stderr)
    by_call: dict = {}
    for r in recs:
        for name, (c, w, n) in r.get("by_call", {}).items():
            part = by_call.setdefault(name, [0.0, 0.0, 0])
            part[0] += c
            part[1] += w
            part[2] += n
    # per batch: CPU and wall (s) of each native call, calls
    by_call = {name: [c / batches, w / batches, n / batches]
               for name, (c, w, n) in sorted(by_call.items())}
    return {"epoch_s": sum(r["train_seconds"] for r in lines) / len(lines), "by_call": by_call,
            "cpu": cpu / batches, "native": native / batches, "held": held / batches,
            "schedule": schedule / batches, "wall": sum(r["wall"] for r in recs) / batches,
            "off": max(0.0, outside_wall - outside_cpu) / batches, "batches": batches,
            "calls_per_batch": calls / batches, "overhead_us": over["total"] * 1e6}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small data: about 2 minutes")
    p.add_argument("--apps", default="mf,wv,kge")
    p.add_argument("--threads", default="1,2", help="worker thread counts")
    p.add_argument("--setups", default="baseline,adapm")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds of all setups of an app; the table shows each one's median")
    p.add_argument("--compare", metavar="DIR", default=None,
                   help="also run every setup with the adapm of checkout DIR (built in place)")
    p.add_argument("--tree", metavar="DIR", default=None,
                   help="run 'this' side with the adapm of checkout DIR (built in place)")
    p.add_argument("--breakdown", action="store_true",
                   help="also a table of each native call's CPU and wall time per batch")
    p.add_argument("--labels", default="compared,this",
                   help="with --compare: the table's names of the two sides")
    opts = p.parse_args()
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    size = "quick" if opts.quick else "full"
    epochs = opts.epochs
    threads = [int(t) for t in opts.threads.split(",")]
    setups = opts.setups.split(",")
    rows = []
    for app in opts.apps.split(","):
        data = generate(app, size, env)
        base = app_args(app, data, epochs)
        trees = [opts.compare, opts.tree] if opts.compare else [opts.tree]
        combos = [(s, t, tree) for s in setups for t in threads for tree in trees]
        runs: dict = {c: [] for c in combos}
        for _ in range(opts.repeat):
            for s, t, tree in combos:
                args = [*base, "--workers", str(t), *(["--baseline"] if s == "baseline" else [])]
                runs[(s, t, tree)].append(run_one(app, args, env, tree))

        def median(c) -> dict:
            return sorted(runs[c], key=lambda r: r["cpu"])[len(runs[c]) // 2]

        for s, t, tree in combos:
            chosen = median((s, t, tree))
            one = median((s, threads[0], tree))
            rows.append((app, s, t, tree, chosen, chosen["cpu"] / one["cpu"]))
    print(f"\n{size} data, {epochs} epoch(s), figures per batch in us "
          f"(instrumentation taken out: ~{rows[0][4]['overhead_us']:.1f} us per timed call)\n")
    tree_column = "| tree " if opts.compare else ""
    print(f"| app | setup | threads {tree_column}| epoch (s) | batches | worker CPU / batch | "
          "vs 1 thread | native / batch | schedule / batch | GIL-held* / batch | "
          "GIL-held* share | wall / batch | off-CPU outside native / batch |")
    print("|---|---|---:|" + ("---|" if opts.compare else "") + "---:|---:|---:|---:|---:|---:|"
          "---:|---:|---:|---:|")
    for app, s, t, tree, r, ratio in rows:
        label = opts.labels.split(",")[0 if tree == opts.compare else 1]
        where = f"| {label} " if opts.compare else ""
        print(f"| {app} | {s} | {t} {where}| {r['epoch_s']:.2f} | {r['batches']:,} | "
              f"{r['cpu'] * 1e6:.0f} | {ratio:.2f}x | {r['native'] * 1e6:.0f} | "
              f"{r['schedule'] * 1e6:.0f} | "
              f"{r['held'] * 1e6:.0f} | {100 * r['held'] / r['cpu']:.0f}% | "
              f"{r['wall'] * 1e6:.0f} | {r['off'] * 1e6:.0f} |")
    print("\n* CPU outside the GIL-releasing native calls and the schedule: counts numpy's own "
          "GIL-released loops as held and the native calls' argument checks as released")
    if opts.breakdown:
        print("\nNative calls per batch: CPU us (wall us) [calls], bracket included\n")
        names = sorted({n for *_, r, _ in rows for n in r["by_call"]})
        print(f"| app | setup | threads {tree_column}| " + " | ".join(names) + " |")
        print("|---|---|---:|" + ("---|" if opts.compare else "") + "---:|" * len(names))
        for app, s, t, tree, r, _ in rows:
            label = opts.labels.split(",")[0 if tree == opts.compare else 1]
            where = f"| {label} " if opts.compare else ""
            cells = []
            for n in names:
                c = r["by_call"].get(n)
                cells.append(f"{c[0] * 1e6:.1f} ({c[1] * 1e6:.1f}) [{c[2]:.2f}]" if c else "")
            print(f"| {app} | {s} | {t} {where}| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:])
    else:
        main()
