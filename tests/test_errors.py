"""Bad input: every error is an AdaPMError (and ValueError/TypeError where that fits), names the
offending argument, is raised before any state changes, and leaves the node working.

After every refused call the tests pull every key and compare with the values expected had the
call never been made, and check that the node's counters did not move either.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import adapm
from adapm import (
    AdaPMError,
    Config,
    ConfigError,
    InvalidArgument,
    InvalidType,
    StateError,
)
from adapm.config import detect_cluster
from adapm.testing import run_cluster

NUM_KEYS, DIM = 10, 3
ALL = np.arange(NUM_KEYS)


@pytest.fixture(autouse=True)
def _single_node(no_launcher):
    """Every test here runs adapm.init() as a single node (tests/conftest.py)."""


def initial_values(num_keys=NUM_KEYS, dim=DIM):
    return (np.arange(num_keys * dim, dtype=np.float32).reshape(num_keys, dim) + 1)


@pytest.fixture
def setup():
    """A node whose key k holds 3k+1, 3k+2, 3k+3; and one worker."""
    node = adapm.init(num_keys=NUM_KEYS, value_length=DIM)
    w = node.worker()
    w.set(ALL, initial_values())
    yield node, w
    node.shutdown()


def counters(node):
    """Integer stats a call on this node could change (not what peers send us meanwhile: in a
    cluster test the other rank's barrier message may arrive at any time)."""
    stats = node.stats()
    return {k: v for k, v in stats.items() if isinstance(v, int) and "received" not in k}


def assert_refused(call, node, w, expected, exc_type, name):
    """``call`` raises ``exc_type`` (an AdaPMError) naming ``name``, and changes nothing."""
    before = counters(node)
    with pytest.raises(exc_type) as info:
        call(w)
    err = info.value
    assert isinstance(err, AdaPMError), type(err)
    assert name in str(err), f"message {str(err)!r} does not name {name!r}"
    assert counters(node) == before, "a refused call changed the counters"
    np.testing.assert_array_equal(w.pull(ALL), expected)
    return err


ONES2 = np.ones((2, DIM), np.float32)
ONES3 = np.ones((3, DIM), np.float32)

# (call, error type, word the message must contain)
BAD_CALLS = {
    # keys out of range
    "pull key == num_keys": (lambda w: w.pull([0, NUM_KEYS]), InvalidArgument, "keys"),
    "pull scalar key too large": (lambda w: w.pull(NUM_KEYS), InvalidArgument, "keys"),
    "pull huge key": (lambda w: w.pull([2**40]), InvalidArgument, "keys"),
    "pull key beyond int64": (lambda w: w.pull([2**64]), AdaPMError, "keys"),
    "push one bad key among good": (lambda w: w.push([1, 2, NUM_KEYS], ONES3), InvalidArgument,
                                    "keys"),
    "push bad key first": (lambda w: w.push([NUM_KEYS + 5, 2, 1], ONES3), InvalidArgument, "keys"),
    "set one bad key": (lambda w: w.set([1, NUM_KEYS], ONES2), InvalidArgument, "keys"),
    "intent bad key": (lambda w: w.intent([1, NUM_KEYS], 0), InvalidArgument, "keys"),
    # negative keys
    "pull negative": (lambda w: w.pull([-1]), InvalidArgument, "keys"),
    "pull negative int8": (lambda w: w.pull(np.array([3, -1], np.int8)), InvalidArgument, "keys"),
    "push negative among good": (lambda w: w.push([3, -1], ONES2), InvalidArgument, "keys"),
    "set negative": (lambda w: w.set([-5, 0], ONES2), InvalidArgument, "keys"),
    "intent negative": (lambda w: w.intent([-1], 0), InvalidArgument, "keys"),
    # float keys, even whole-number ones
    "pull float list": (lambda w: w.pull([1.0, 2.0]), InvalidType, "keys"),
    "pull float scalar": (lambda w: w.pull(1.0), InvalidType, "keys"),
    "pull float ndarray": (lambda w: w.pull(np.array([1.0, 2.0])), InvalidType, "keys"),
    "pull float32 ndarray": (lambda w: w.pull(np.array([1], np.float32)), InvalidType, "keys"),
    "pull int and float": (lambda w: w.pull([1, 2.5]), InvalidType, "keys"),
    "pull numpy float scalar": (lambda w: w.pull(np.float64(3)), InvalidType, "keys"),
    "push float keys": (lambda w: w.push([1.0, 2.0], ONES2), InvalidType, "keys"),
    "set float keys": (lambda w: w.set(np.array([1.0, 2.0]), ONES2), InvalidType, "keys"),
    "intent float keys": (lambda w: w.intent([1.0], 0), InvalidType, "keys"),
    "pull complex keys": (lambda w: w.pull([1j]), InvalidType, "keys"),
    # bool keys
    "pull bool list": (lambda w: w.pull([True, False]), InvalidType, "keys"),
    "pull bool scalar": (lambda w: w.pull(True), InvalidType, "keys"),
    "pull numpy bool": (lambda w: w.pull(np.array([True, False])), InvalidType, "keys"),
    "pull numpy bool scalar": (lambda w: w.pull(np.bool_(True)), InvalidType, "keys"),
    "push bool keys": (lambda w: w.push([True, False], ONES2), InvalidType, "keys"),
    # object and string keys
    "pull object ndarray": (lambda w: w.pull(np.array([1, 2], dtype=object)), InvalidType, "keys"),
    "pull strings": (lambda w: w.pull(["1", "2"]), InvalidType, "keys"),
    "pull string": (lambda w: w.pull("12"), InvalidType, "keys"),
    "pull bytes": (lambda w: w.pull(b"12"), InvalidType, "keys"),
    "pull None": (lambda w: w.pull(None), InvalidType, "keys"),
    "pull list with None": (lambda w: w.pull([1, None]), InvalidType, "keys"),
    "pull dict": (lambda w: w.pull({1: 2}), InvalidType, "keys"),
    "pull ragged": (lambda w: w.pull([[1, 2], [3]]), InvalidType, "keys"),
    "push object keys": (lambda w: w.push(np.array([1, 2], dtype=object), ONES2), InvalidType,
                         "keys"),
    # uint64 keys too large (must not wrap around into range through a cast to int64)
    "pull uint64 max": (lambda w: w.pull(np.array([2**64 - 1], np.uint64)), InvalidArgument,
                        "keys"),
    "pull uint64 2**63": (lambda w: w.pull(np.array([1, 2**63], np.uint64)), InvalidArgument,
                          "keys"),
    "pull uint64 == num_keys": (lambda w: w.pull(np.array([NUM_KEYS], np.uint64)),
                                InvalidArgument, "keys"),
    "push uint64 too large": (lambda w: w.push(np.array([1, 2**63 + 1], np.uint64), ONES2),
                              InvalidArgument, "keys"),
    # wrong update shape
    "push too few columns": (lambda w: w.push([1, 2], np.ones((2, DIM - 1), np.float32)),
                             InvalidArgument, "updates"),
    "push too many rows": (lambda w: w.push([1, 2], ONES3), InvalidArgument, "updates"),
    "push too few rows": (lambda w: w.push([1, 2], np.ones((1, DIM), np.float32)),
                          InvalidArgument, "updates"),
    "push flat for dim 3": (lambda w: w.push([1, 2], np.ones(2 * DIM, np.float32)),
                            InvalidArgument, "updates"),
    "push 3-d": (lambda w: w.push([1, 2], np.ones((2, DIM, 1), np.float32)), InvalidArgument,
                 "updates"),
    "push list wrong shape": (lambda w: w.push([1, 2], [[1, 2, 3]]), InvalidArgument, "updates"),
    "push scalar update": (lambda w: w.push([1], 1.0), InvalidType, "updates"),
    "push None update": (lambda w: w.push([1], None), InvalidType, "updates"),
    "push string update": (lambda w: w.push([1], "abc"), InvalidType, "updates"),
    "push ragged update": (lambda w: w.push([1, 2], [[1, 2, 3], [1]]), AdaPMError, "updates"),
    "set wrong shape": (lambda w: w.set([1, 2], np.ones((2, DIM + 1), np.float32)),
                        InvalidArgument, "values"),
    # wrong dtype
    "push float64": (lambda w: w.push([1, 2], np.ones((2, DIM))), InvalidType, "updates"),
    "push int64": (lambda w: w.push([1, 2], np.ones((2, DIM), np.int64)), InvalidType, "updates"),
    "push float16": (lambda w: w.push([1, 2], np.ones((2, DIM), np.float16)), InvalidType,
                     "updates"),
    "set float64": (lambda w: w.set([1, 2], np.ones((2, DIM))), InvalidType, "values"),
    # out=
    "out float64": (lambda w: w.pull([1, 2], out=np.zeros((2, DIM))), InvalidType, "out"),
    "out int32": (lambda w: w.pull([1, 2], out=np.zeros((2, DIM), np.int32)), InvalidType, "out"),
    "out list": (lambda w: w.pull([1, 2], out=[[0] * DIM] * 2), InvalidType, "out"),
    "out wrong rows": (lambda w: w.pull([1, 2], out=np.zeros((3, DIM), np.float32)),
                       InvalidArgument, "out"),
    "out wrong columns": (lambda w: w.pull([1, 2], out=np.zeros((2, DIM + 1), np.float32)),
                          InvalidArgument, "out"),
    "out flat": (lambda w: w.pull([1, 2], out=np.zeros(2 * DIM, np.float32)), InvalidArgument,
                 "out"),
    "out non-contiguous": (lambda w: w.pull([1, 2], out=np.zeros((2, 2 * DIM), np.float32)[:, ::2]),
                           InvalidArgument, "out"),
    "out fortran order": (lambda w: w.pull([1, 2], out=np.zeros((2, DIM), np.float32, order="F")),
                          InvalidArgument, "out"),
    "out read-only": (lambda w: w.pull([1, 2], out=_readonly((2, DIM))), InvalidArgument, "out"),
    "out with bad key": (lambda w: w.pull([1, NUM_KEYS], out=np.zeros((2, DIM), np.float32)),
                         InvalidArgument, "keys"),
    # intent clocks
    "intent end == start": (lambda w: w.intent([1], 3, 3), InvalidArgument, "end"),
    "intent end < start": (lambda w: w.intent([1], 3, 2), InvalidArgument, "start"),
    "intent negative start": (lambda w: w.intent([1], -1), InvalidArgument, "start"),
    "intent negative end": (lambda w: w.intent([1], 0, -1), InvalidArgument, "end"),
    "intent huge end": (lambda w: w.intent([1], 1, 2**70), InvalidArgument, "end"),
    "intent huge start": (lambda w: w.intent([1], 2**62 + 1), InvalidArgument, "start"),
    "intent float start": (lambda w: w.intent([1], 1.5), InvalidType, "start"),
    "intent whole float start": (lambda w: w.intent([1], 1.0), InvalidType, "start"),
    "intent string start": (lambda w: w.intent([1], "1"), InvalidType, "start"),
    "intent None start": (lambda w: w.intent([1], None), InvalidType, "start"),
    "intent bool start": (lambda w: w.intent([1], True), InvalidType, "start"),
    "intent float end": (lambda w: w.intent([1], 1, 2.5), InvalidType, "end"),
}


def _readonly(shape):
    out = np.zeros(shape, np.float32)
    out.setflags(write=False)
    return out


@pytest.mark.parametrize("case", list(BAD_CALLS), ids=list(BAD_CALLS))
def test_bad_call_refused_and_node_keeps_working(setup, case):
    node, w = setup
    call, exc_type, name = BAD_CALLS[case]
    expected = initial_values()
    err = assert_refused(call, node, w, expected, exc_type, name)
    builtin = ValueError if isinstance(err, InvalidArgument) else TypeError
    if isinstance(err, (InvalidArgument, InvalidType)):
        assert isinstance(err, builtin)
    # The node and this worker keep working: a valid push and set go through.
    w.push([1, 2], ONES2)
    expected[[1, 2]] += 1
    w.set([0], np.full((1, DIM), -4, np.float32))
    expected[0] = -4
    np.testing.assert_array_equal(w.pull(ALL), expected)
    w.intent([1], 0, 2)
    w.wait_sync()


def test_out_untouched_when_refused(setup):
    node, w = setup
    out = np.full((3, DIM), 9, np.float32)
    with pytest.raises(InvalidArgument, match="out"):
        w.pull([1, 2], out=out)
    assert np.all(out == 9)
    with pytest.raises(InvalidArgument, match="keys"):
        w.pull([1, 2, NUM_KEYS], out=out)
    assert np.all(out == 9)


def test_input_errors_are_value_or_type_errors(setup):
    """Code written against numpy conventions can catch ValueError/TypeError."""
    node, w = setup
    with pytest.raises(ValueError):
        w.pull([NUM_KEYS])
    with pytest.raises(TypeError):
        w.pull([1.0])
    with pytest.raises(TypeError):
        w.push([1], np.ones((1, DIM)))
    with pytest.raises(ValueError):
        w.push([1], np.ones((2, DIM), np.float32))
    with pytest.raises(ValueError):
        w.intent([1], 2, 1)


@pytest.mark.parametrize("value", [2**64 - 1, 2**63, NUM_KEYS])
def test_uint64_key_error_names_the_real_value(setup, value):
    """A uint64 key must be reported as given, not as what a cast to int64 wraps it to."""
    node, w = setup
    with pytest.raises(InvalidArgument) as info:
        w.pull(np.array([0, value], np.uint64))
    assert f"keys[1] = {value} " in str(info.value)
    np.testing.assert_array_equal(w.pull(ALL), initial_values())


_bad_key = st.one_of(st.integers(NUM_KEYS, 2**62), st.integers(-(2**62), -1))


@settings(max_examples=40, deadline=None)
@given(good=st.lists(st.integers(0, NUM_KEYS - 1), max_size=6), bad=_bad_key,
       where=st.integers(0, 6), op=st.sampled_from(["push", "set", "pull"]))
def test_one_bad_key_anywhere_changes_nothing(good, bad, where, op):
    keys = list(good)
    keys.insert(min(where, len(keys)), bad)
    with adapm.init(num_keys=NUM_KEYS, value_length=DIM) as node:
        w = node.worker()
        w.set(ALL, initial_values())
        vals = np.full((len(keys), DIM), 100, np.float32)
        before = counters(node)
        with pytest.raises(InvalidArgument) as info:
            if op == "push":
                w.push(keys, vals)
            elif op == "set":
                w.set(keys, vals)
            else:
                w.pull(keys)
        position = keys.index(bad)
        assert f"keys[{position}]" in str(info.value)
        assert str(bad) in str(info.value)
        assert counters(node) == before
        np.testing.assert_array_equal(w.pull(ALL), initial_values())


# --- per-key lengths ---------------------------------------------------------------------------

LENGTHS = np.array([1, 2, 3, 1])


@pytest.fixture
def packed():
    node = adapm.init(num_keys=4, value_length=LENGTHS)
    w = node.worker()
    w.set(np.arange(4), np.arange(1, 8, dtype=np.float32))
    yield node, w
    node.shutdown()


PACKED_CALLS = {
    "updates too short": (lambda w: w.push([0, 1], np.ones(2, np.float32)), "updates"),
    "updates too long": (lambda w: w.push([0, 1], np.ones(4, np.float32)), "updates"),
    "updates as rows": (lambda w: w.push([0, 3], np.ones((2, 1), np.float32)), "updates"),
    "updates 2-d right size": (lambda w: w.push([1, 2], np.ones((1, 5), np.float32)), "updates"),
    "values too short": (lambda w: w.set([2], np.ones(2, np.float32)), "values"),
    "out too short": (lambda w: w.pull([2, 2], out=np.zeros(5, np.float32)), "out"),
    "out as rows": (lambda w: w.pull([0, 3], out=np.zeros((2, 1), np.float32)), "out"),
}


@pytest.mark.parametrize("case", list(PACKED_CALLS), ids=list(PACKED_CALLS))
def test_per_key_length_mismatch(packed, case):
    node, w = packed
    call, name = PACKED_CALLS[case]
    before = counters(node)
    with pytest.raises(InvalidArgument) as info:
        call(w)
    assert isinstance(info.value, ValueError)
    assert name in str(info.value)
    assert counters(node) == before
    np.testing.assert_array_equal(w.pull(np.arange(4)), np.arange(1, 8))
    w.push([1], np.array([10, 10], np.float32))
    np.testing.assert_array_equal(w.pull([1]), [12, 13])


# --- state errors ------------------------------------------------------------------------------

AFTER_SHUTDOWN = {
    "pull": lambda node, w: w.pull([1]),
    "pull out": lambda node, w: w.pull([1], out=np.zeros((1, DIM), np.float32)),
    "push": lambda node, w: w.push([1], np.ones((1, DIM), np.float32)),
    "set": lambda node, w: w.set([1], np.ones((1, DIM), np.float32)),
    "intent": lambda node, w: w.intent([1], 0),
    "wait": lambda node, w: w.wait(),
    "wait_sync": lambda node, w: w.wait_sync(),
    "advance_clock": lambda node, w: w.advance_clock(),
    "worker": lambda node, w: node.worker(),
    "barrier": lambda node, w: node.barrier(),
    "local_keys": lambda node, w: node.local_keys(),
    "native_rows": lambda node, w: w.native_rows(),
}


@pytest.mark.parametrize("case", list(AFTER_SHUTDOWN), ids=list(AFTER_SHUTDOWN))
def test_calls_after_shutdown_raise_state_error(case):
    node = adapm.init(num_keys=NUM_KEYS, value_length=DIM)
    w = node.worker()
    node.shutdown()
    with pytest.raises(StateError) as info:
        AFTER_SHUTDOWN[case](node, w)
    assert isinstance(info.value, AdaPMError)
    assert "shut down" in str(info.value)
    call = {"pull out": "pull"}.get(case, case)
    assert str(info.value).startswith(f"{call}: ")  # names the call


def test_shutdown_is_idempotent_and_valid_input_checked_first():
    node = adapm.init(num_keys=NUM_KEYS, value_length=DIM)
    w = node.worker()
    node.shutdown()
    node.shutdown()
    # Use after shutdown is reported as such, even with bad arguments.
    with pytest.raises(StateError):
        w.pull([NUM_KEYS])


def test_init_twice_raises_and_first_node_unharmed():
    node = adapm.init(num_keys=NUM_KEYS, value_length=DIM)
    try:
        w = node.worker()
        w.set(ALL, initial_values())
        with pytest.raises(StateError, match="already"):
            adapm.init(num_keys=NUM_KEYS, value_length=DIM)
        with pytest.raises(StateError):
            adapm.init(config=Config(num_keys=3))
        np.testing.assert_array_equal(w.pull(ALL), initial_values())
    finally:
        node.shutdown()
    adapm.init(num_keys=2).shutdown()


def test_init_argument_errors():
    with pytest.raises(InvalidArgument, match="config"):
        adapm.init(num_keys=5, config=Config(num_keys=5))
    with pytest.raises(InvalidArgument, match="num_keys"):
        adapm.init()
    # A refused init registers nothing: the next one works.
    adapm.init(num_keys=2).shutdown()


# --- configuration errors ----------------------------------------------------------------------

CONFIG_CASES = {
    "num_keys 0": (dict(num_keys=0), "num_keys"),
    "num_keys negative": (dict(num_keys=-3), "num_keys"),
    "num_keys float": (dict(num_keys=5.0), "num_keys"),
    "num_keys bool": (dict(num_keys=True), "num_keys"),
    "num_keys string": (dict(num_keys="5"), "num_keys"),
    "value_length 0": (dict(num_keys=5, value_length=0), "value_length"),
    "value_length negative": (dict(num_keys=5, value_length=-2), "value_length"),
    "value_length bool": (dict(num_keys=5, value_length=True), "value_length"),
    "value_length float": (dict(num_keys=5, value_length=2.0), "value_length"),
    "value_length too short": (dict(num_keys=3, value_length=np.array([1, 2])), "value_length"),
    "value_length too long": (dict(num_keys=3, value_length=[1, 2, 3, 4]), "value_length"),
    "value_length zero entry": (dict(num_keys=3, value_length=np.array([1, 0, 2])),
                                "value_length"),
    "value_length negative entry": (dict(num_keys=3, value_length=[1, -1, 2]), "value_length"),
    "value_length float entries": (dict(num_keys=2, value_length=np.array([1.0, 2.0])),
                                   "value_length"),
    "value_length 2-d": (dict(num_keys=2, value_length=np.ones((2, 1), int)), "value_length"),
    "management unknown": (dict(num_keys=5, management="bogus"), "management"),
    "management none": (dict(num_keys=5, management=None), "management"),
    "rank == world_size": (dict(num_keys=5, rank=1, world_size=1), "rank"),
    "rank > world_size": (dict(num_keys=5, rank=3, world_size=2, rendezvous="127.0.0.1:5000"),
                          "rank"),
    "rank negative": (dict(num_keys=5, rank=-1), "rank"),
    "world_size 0": (dict(num_keys=5, world_size=0), "world_size"),
    "world_size 2 without rendezvous": (dict(num_keys=5, rank=0, world_size=2), "rendezvous"),
    "rendezvous without port": (dict(num_keys=5, world_size=2, rendezvous="localhost"),
                                "rendezvous"),
    "rendezvous bad port": (dict(num_keys=5, world_size=2, rendezvous="localhost:99999"),
                            "rendezvous"),
    "request_timeout_s 0": (dict(num_keys=5, request_timeout_s=0), "request_timeout_s"),
    "request_timeout_s nan": (dict(num_keys=5, request_timeout_s=math.nan), "request_timeout_s"),
    "connect_timeout_s inf": (dict(num_keys=5, connect_timeout_s=math.inf), "connect_timeout_s"),
    "connect_timeout_s string": (dict(num_keys=5, connect_timeout_s="3"), "connect_timeout_s"),
    "timing_alpha 0": (dict(num_keys=5, timing_alpha=0.0), "timing_alpha"),
    "timing_p 1": (dict(num_keys=5, timing_p=1.0), "timing_p"),
    "timing_lambda0 0": (dict(num_keys=5, timing_lambda0=0), "timing_lambda0"),
    "max_rounds_per_s 0": (dict(num_keys=5, max_rounds_per_s=0), "max_rounds_per_s"),
    "replica_updates mean": (dict(num_keys=5, replica_updates="mean"), "replica_updates"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES), ids=list(CONFIG_CASES))
def test_config_errors(case):
    fields, name = CONFIG_CASES[case]
    with pytest.raises(ConfigError) as info:
        Config(**fields)
    assert isinstance(info.value, (AdaPMError, ValueError))
    assert name in str(info.value)


@pytest.mark.parametrize("case", ["num_keys 0", "value_length too short", "management unknown",
                                  "world_size 2 without rendezvous"])
def test_config_errors_through_init(case):
    fields, name = CONFIG_CASES[case]
    with pytest.raises(ConfigError, match=name):
        adapm.init(**fields)
    adapm.init(num_keys=2).shutdown()  # nothing was left registered


@pytest.mark.parametrize("settings, message", [
    (dict(num_keys=5, value_lenght=2), "value_lenght: not a setting of adapm.Config; did you "
                                       "mean value_length?"),
    (dict(num_keys=5, foo=1), "foo: not a setting of adapm.Config"),
    # beyond the 128 TiB of a Linux process's address space, however the memory is overcommitted
    (dict(num_keys=2**45, value_length=2), "cannot reserve the 524,288.0 GiB"),
    (dict(num_keys=3, value_length=np.array([2**46, 1, 1])), "cannot reserve the 524,288.0 GiB"),
])
def test_init_settings_beyond_the_config_or_the_machine_are_config_errors(settings, message):
    """A misspelt setting was Python's TypeError; sizes beyond the machine were numpy's
    MemoryError or mmap's OSError: ConfigErrors naming the setting or the sizes."""
    with pytest.raises(ConfigError) as info:
        adapm.init(**settings)
    assert message in str(info.value), info.value
    adapm.init(num_keys=2).shutdown()  # nothing was left registered


def test_config_is_frozen_and_replace_validates():
    cfg = Config(num_keys=5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_keys = 6
    with pytest.raises(ConfigError, match="num_keys"):
        cfg.replace(num_keys=0)
    assert cfg.num_keys == 5


@pytest.mark.parametrize("env,name", [
    ({"ADAPM_RANK": "x", "ADAPM_WORLD_SIZE": "2"}, "ADAPM_RANK"),
    ({"ADAPM_RANK": "0", "ADAPM_WORLD_SIZE": "two"}, "ADAPM_WORLD_SIZE"),
    ({"MASTER_ADDR": "h", "MASTER_PORT": "p"}, "MASTER_PORT"),
])
def test_environment_errors_name_the_variable(env, name):
    with pytest.raises(ConfigError, match=name):
        detect_cluster(env)


def test_environment_timeout_error_names_variable():
    with pytest.raises(ConfigError, match="ADAPM_REQUEST_TIMEOUT_S"):
        Config.from_env(env={"ADAPM_REQUEST_TIMEOUT_S": "soon"}, num_keys=3)


@pytest.mark.parametrize("text, expected", [("all", "all"), (" 5 ", 5), ("1,4", [1, 4]),
                                            ("4,", [4])])
def test_trace_keys_from_the_environment_read_as_the_flag_reads_them(text, expected):
    got = Config.from_env(env={"ADAPM_TRACE_KEYS": text}, num_keys=9).trace_keys
    assert (got if isinstance(got, (str, int)) else list(got)) == expected
    # Every form in the message: the variable's old one said "an integer" for a list or "all".
    for bad in ("foo", "1,x", "0", ","):
        with pytest.raises(ConfigError, match=r'ADAPM_TRACE_KEYS: (expected "all", a number of '
                                              r'keys to sample, or keys like 1,5,9|a sample of 0 '
                                              r'keys|no keys given)'):
            Config.from_env(env={"ADAPM_TRACE_KEYS": bad}, num_keys=9)


# --- distributed: a refused push changes nothing on any node ------------------------------------

D_KEYS, D_DIM = 12, 2


def _bad_push_job(node):
    w = node.worker()
    everything = np.arange(D_KEYS)
    caught = []
    if node.rank == 0:
        before = counters(node)
        remote = [1, 3, 5]  # homes on rank 1
        calls = [
            lambda: w.push(remote + [D_KEYS], np.ones((4, D_DIM), np.float32)),
            lambda: w.push(remote + [-1], np.ones((4, D_DIM), np.float32)),
            lambda: w.push(remote, np.ones((3, D_DIM))),  # float64
            lambda: w.push(remote, np.ones((2, D_DIM), np.float32)),
            lambda: w.push([1.0, 3.0], np.ones((2, D_DIM), np.float32)),
            lambda: w.set(remote + [D_KEYS + 7], np.ones((4, D_DIM), np.float32)),
            lambda: w.pull(remote + [D_KEYS]),
            lambda: w.pull(remote, out=np.zeros((3, D_DIM))),
        ]
        for call in calls:
            try:
                call()
            except AdaPMError as exc:
                caught.append(type(exc).__name__)
            else:
                caught.append("no error")
        w.wait()
        after = counters(node)
        changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    else:
        changed = {}
    node.barrier()
    seen_after_bad = w.pull(everything).tolist()
    node.barrier()
    # The node still works across nodes: a valid remote push from rank 0 arrives.
    if node.rank == 0:
        w.push([1, 3], np.ones((2, D_DIM), np.float32))
        w.wait()
    node.barrier()
    seen_after_good = w.pull(everything).tolist()
    return caught, changed, seen_after_bad, seen_after_good


def test_distributed_bad_push_changes_nothing_anywhere():
    results = run_cluster(_bad_push_job, world_size=2, timeout_s=60,
                          config=dict(num_keys=D_KEYS, value_length=D_DIM,
                                      management="static_partition",
                                      connect_timeout_s=20, request_timeout_s=10))
    caught0 = results[0][0]
    assert caught0 == ["InvalidArgument", "InvalidArgument", "InvalidType", "InvalidArgument",
                       "InvalidType", "InvalidArgument", "InvalidArgument", "InvalidType"]
    assert results[0][1] == {}, f"refused calls changed rank 0's counters: {results[0][1]}"
    good = np.zeros((D_KEYS, D_DIM))
    good[[1, 3]] = 1
    for rank, (_, _, after_bad, after_good) in enumerate(results):
        np.testing.assert_array_equal(after_bad, np.zeros((D_KEYS, D_DIM)), err_msg=f"rank {rank}")
        np.testing.assert_array_equal(after_good, good, err_msg=f"rank {rank}")


def test_a_barrier_name_must_be_a_short_str(no_launcher):
    with adapm.init(num_keys=4) as node:
        for bad in (5, "", "x" * 201, "shutdown", "checkpoint"):
            with pytest.raises(adapm.InvalidArgument, match="barrier: name must be a str"):
                node.barrier(name=bad)
        node.barrier(name="epoch end")  # one node: nothing to meet
