"""Running the apps as a user does, for the app tests: a clean launcher environment, a command
that must exit as expected, and the JSON lines it printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# No launcher variables from the calling shell (a test decides rank and world size), passive
# OpenMP waits and one OpenMP thread (two cores are shared), generous connect and request
# timeouts for a loaded machine.
ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1",
       "ADAPM_CONNECT_TIMEOUT_S": "60", "ADAPM_REQUEST_TIMEOUT_S": "60"}
for var in ("ADAPM_RANK", "ADAPM_WORLD_SIZE", "ADAPM_RENDEZVOUS", "RANK", "WORLD_SIZE",
            "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
            "SLURM_PROCID", "SLURM_NTASKS", "MASTER_ADDR", "MASTER_PORT"):
    ENV.pop(var, None)
PY = sys.executable
LAUNCHER = [PY, "-m", "adapm.launch"]


def run(cmd, timeout=240, expect=0, cwd=None, env=None):
    """Run ``cmd`` (in ``cwd``, with ``env`` added to ENV); it must exit with ``expect`` (the
    output is shown when it does not)."""
    proc = subprocess.run(cmd, env={**ENV, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)
    assert proc.returncode == expect, (f"exit {proc.returncode}, expected {expect}\n"
                                       f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n"
                                       f"{proc.stderr[-3000:]}")
    return proc


def records(stdout: str) -> list[dict]:
    """The JSON lines of an app's stdout."""
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def one_line_error(proc, *words) -> None:
    """A user's mistake told in one line on stderr naming ``words``: no traceback, no output."""
    assert proc.stderr.count("\n") == 1 and "error: " in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not records(proc.stdout), proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


_COUNTING_JOB = """
import sys
from adapm._native_loader import load
from adapm.apps import {app}
K = load("adapm._kernels")
calls = []
original = K.{kernel}
def counted(*args, **kwargs):
    calls.append(1)
    return original(*args, **kwargs)
K.{kernel} = counted
code = {app}.main(sys.argv[1:])
sys.stderr.write(f"native runs {{len(calls)}}\\n")  # one write: the ranks share the pipe
sys.exit(code)
"""


def counting_job(directory, app: str, kernel: str):
    """A script that runs ``python -m adapm.apps.<app>`` with its arguments and, at the end,
    writes ``native runs N`` to stderr: the calls it made of the kernel ``kernel`` (one line a
    rank under the launcher; read them with ``re.findall(r"native runs (\\d+)", stderr)``)."""
    path = directory / f"{app}_{kernel}_job.py"
    path.write_text(_COUNTING_JOB.format(app=app, kernel=kernel))
    return path


def peer_dies_mid_run(argv: list, job: str) -> str:
    """Two ranks of ``argv`` started by hand (no launcher to stop the survivor); rank 1 is
    killed once rank 0 printed its first epoch line. Rank 0 must exit 1 naming the failed node
    in one line ("error: ... rank 1 failed ... ADAPM_DEBUG=1"), not a traceback; returns its
    stderr."""
    from adapm.launch import free_port

    common = {**ENV, "ADAPM_WORLD_SIZE": "2", "ADAPM_FAILURE_TIMEOUT_S": "3",
              "ADAPM_RENDEZVOUS": f"127.0.0.1:{free_port()}", "ADAPM_JOB": job}
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**common, "ADAPM_RANK": str(rank)}) for rank in (0, 1)]
    try:
        assert procs[0].stdout.readline().startswith("epoch 1:")  # both train
        procs[1].kill()
        _, err = procs[0].communicate(timeout=90)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert procs[0].returncode == 1, (procs[0].returncode, err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert "error: " in err and "rank 1 failed" in err and "ADAPM_DEBUG=1" in err, err
    return err


def ctrl_c_under_the_launcher(argv: list) -> None:
    """``argv`` on 2 ranks under adapm-run, SIGINT to the whole job once rank 0 trains, as
    Ctrl-C on a terminal sends it (each rank gets it twice: from the terminal and from
    adapm-run): "interrupted" per rank and exit 130, no traceback."""
    import signal

    proc = subprocess.Popen(
        [*LAUNCHER, "-n", "2", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=ENV, start_new_session=True,
        # SIGINT at its default (a suite started in a shell's background inherits it ignored)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.readline().startswith("epoch 1:")  # training
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err and err.count("interrupted") == 2, err
