"""No silent fallbacks, no unbounded waits: each misconfiguration or misuse that used to run on
quietly (as N unrelated single nodes, forever, or until a timeout blamed a healthy peer) is now
a clear error."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import adapm
from adapm.config import ENV_VARIABLES, Config, under_launcher
from adapm.errors import ConfigError, InvalidArgument, InvalidType, StateError
from adapm.testing import run_cluster

from app_cli import LAUNCHER, PY, records, run

LAUNCHED = {"ADAPM_RANK": "1", "ADAPM_WORLD_SIZE": "2", "ADAPM_RENDEZVOUS": "127.0.0.1:5555"}


@given(name=st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_", min_size=1, max_size=20))
def test_unknown_adapm_variable_is_an_error(name):
    var = "ADAPM_" + name
    if var in ENV_VARIABLES:
        return
    with pytest.raises(ConfigError, match=f"unknown environment variable {var}"):
        Config.from_env(env={var: "1"}, num_keys=4)


def test_misspelt_variable_names_the_right_one():
    with pytest.raises(ConfigError, match="did you mean ADAPM_REQUEST_TIMEOUT_S"):
        Config.from_env(env={"ADAPM_REQUEST_TIMEOUT": "5"}, num_keys=4)


@pytest.mark.parametrize("env", [{"ADAPM_RANK": "1"}, {"ADAPM_WORLD_SIZE": "2"},
                                 {"OMPI_COMM_WORLD_RANK": "0"}, {"PMI_SIZE": "4"}])
def test_half_set_launcher_pair_is_an_error(env):
    (var,) = env
    with pytest.raises(ConfigError, match=f"{var} is set but"):
        Config.from_env(env=env, num_keys=4)


@pytest.mark.parametrize("env", [{"SLURM_PROCID": "0"}, {"RANK": "3"}])
def test_loose_variables_of_other_tools_mean_no_launcher(env):
    assert Config.from_env(env=env, num_keys=4).world_size == 1


def test_config_under_a_launcher_takes_its_ranks():
    config = under_launcher(Config(num_keys=4, value_length=3), LAUNCHED)
    assert (config.rank, config.world_size, config.rendezvous) == (1, 2, "127.0.0.1:5555")
    assert config.value_length == 3
    with pytest.raises(ConfigError, match="launcher started this process as rank 1 of 2"):
        under_launcher(Config(num_keys=4, rank=0, world_size=3, rendezvous="127.0.0.1:1"), LAUNCHED)
    assert under_launcher(Config(num_keys=4), {}).world_size == 1


def test_init_with_a_config_under_adapm_run_joins_the_job():
    # One os.write per line: the ranks share adapm-run's stdout (a pipe), and print() writes
    # the text and its newline separately when Python runs unbuffered (PYTHONUNBUFFERED), so
    # two ranks' lines could run into each other (seen in CI).
    code = ("import adapm, json, os; node = adapm.init(config=adapm.Config(num_keys=4)); "
            "os.write(1, (json.dumps({'rank': node.rank, 'world_size': node.world_size}) "
            "+ chr(10)).encode()); node.shutdown()")
    proc = run(LAUNCHER + ["-n", "2", PY, "-c", code], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted((r["rank"], r["world_size"]) for r in records(proc.stdout)) == [(0, 2), (1, 2)]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, 0.0, "5", True])
def test_timeouts_must_be_finite_and_positive(bad):
    node = adapm.init(num_keys=4)
    try:
        w = node.worker()
        kind = InvalidType if isinstance(bad, (str, bool)) else InvalidArgument
        for call in (lambda: w.wait(bad), lambda: w.wait_sync(bad), lambda: node.barrier(bad),
                     lambda: node.shutdown(bad)):
            with pytest.raises(kind, match="timeout_s"):
                call()
        with pytest.raises(ConfigError, match="failure_timeout_s"):
            Config(num_keys=4, failure_timeout_s=bad)
    finally:
        node.shutdown()


def _shutdown_under_a_waiting_pull(node):
    """Rank 0 stops serving; on rank 1 a thread's pull waits for it. Another thread's use of
    the same handle, and then shutdown(), must not wait for that pull."""
    node.barrier()
    if node.rank == 0:
        node.engine.stop()  # alive (no failure is detected in this test) but deaf
        time.sleep(8)
        node._release()
        return None
    w = node.worker()
    pulled = {}
    started = threading.Event()

    def pull():
        start = time.monotonic()
        started.set()
        while True:
            try:
                w.pull([0])  # homed on rank 0
            except StateError as exc:
                if "in a call from another thread" in str(exc):
                    continue  # the main thread's probe below held the handle for a moment
                pulled["error"] = exc
            except BaseException as exc:
                pulled["error"] = exc
            break
        pulled["waited"] = time.monotonic() - start

    thread = threading.Thread(target=pull)
    thread.start()
    started.wait(30)
    # Until the pull's thread is inside its call (which never returns by itself), a use of the
    # handle from here goes through (a push of a key held here); from then on it is refused.
    # Probed rather than slept on: cores taken away in bursts once kept the thread out of its
    # call for longer than half a second.
    second_thread = None
    deadline = time.monotonic() + 5
    while second_thread is None and time.monotonic() < deadline:
        try:
            w.push([1], np.ones((1, 1), np.float32))
        except StateError as exc:
            second_thread = str(exc)
        else:
            time.sleep(0.05)
    try:
        node.shutdown(timeout_s=1)  # rank 0 never meets it: a timeout, after cleanup
    except adapm.AdaPMError:
        pass
    thread.join(10)
    error = pulled.get("error")
    return second_thread, type(error).__name__, str(error), pulled.get("waited")


def test_shutdown_fails_a_waiting_call_and_a_handle_refuses_a_second_thread():
    results = run_cluster(_shutdown_under_a_waiting_pull, 2, timeout_s=90, config=dict(
        num_keys=4, management="static_partition", request_timeout_s=60, failure_timeout_s=60))
    second_thread, kind, text, waited = results[1]
    assert second_thread is not None and "in a call from another thread" in second_thread
    assert kind == "StateError" and "shut down while this call waited" in text, (kind, text)
    assert waited is not None and waited < 30  # at shutdown, not after the 60 s timeout
