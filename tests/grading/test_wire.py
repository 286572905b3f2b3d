"""What the judge reads back from a learner's process: plain data, tensors and kvlab's own
values, never code, never a change to one of its objects (each case a finding of a review)."""

import collections
import pickle

import pytest
import torch

from kvlab.core.block_manager import PagedCache
from kvlab.grading.lab07 import CachedBlock
from kvlab.grading.remote import JUDGE, LEARNER, Connection, LearnerExit, rebuild_error
from kvlab.grading.wire import MAX_DEPTH, ProtocolError, check_opcodes
from kvlab.serving.scheduler import Scheduler, SequenceStatus


def learner_sends(value, back=None):
    """``value`` as the learner's side encodes a reply, read back by the judge's side."""
    learner, judge = Connection(-1, -1, LEARNER), Connection(-1, -1, JUDGE)
    data, _ = learner.encode(("ok", value, ("", 0), back), by_reference=True)
    message, _ = judge.decode(data)
    return message[1], message[3]


def raw(body: bytes):
    judge = Connection(-1, -1, JUDGE)
    return judge.decode(pickle.dumps((body, {}), protocol=5))


def test_plain_data_tensors_and_kvlabs_values_come_back_as_they_were():
    t = torch.arange(12.0).reshape(3, 4)[:, 1:3]  # a view: its storage and strides travel
    value = {
        "ints": [1, 2, 3],
        "tensor": t,
        "status": SequenceStatus.RUNNING,
        "queue": collections.deque([1, 2]),
        "block": CachedBlock(7, 0, (100, 101)),
        "z": 1 + 2j,
    }
    got, _ = learner_sends(value)
    assert got["ints"] == [1, 2, 3] and torch.equal(got["tensor"], t)
    assert got["status"] is SequenceStatus.RUNNING and got["queue"] == collections.deque([1, 2])
    assert type(got["block"]) is CachedBlock and got["block"] == CachedBlock(7, 0, (100, 101))
    assert got["z"] == 1 + 2j


def test_a_learners_subclass_comes_back_as_its_plain_value():
    """An honest namedtuple or defaultdict scores as in the kernel; an __eq__ of its own is lost."""
    split = collections.namedtuple("Split", "used future internal")(1, 2, 3)
    counts = collections.defaultdict(int, used=4)

    class Yes(tuple):
        def __eq__(self, other):
            return True

        __hash__ = tuple.__hash__

    got, _ = learner_sends([split, counts, Yes((0, 0))])
    assert got[0] == (1, 2, 3) and type(got[0]) is tuple
    assert got[1] == {"used": 4} and type(got[1]) is dict
    assert got[2] != (5, 5)


def test_a_pickle_that_names_calls_or_builds_anything_is_refused():
    # BUILD on one of the judge's own objects (a scheduler it handed out): refused
    judge = Connection(-1, -1, JUDGE)
    handle = judge.export(Scheduler(PagedCache(4, 4)))
    pid = pickle.dumps(("P", handle), protocol=2)[2:-1] + b"Q"
    state = pickle.dumps({"num_preemptions": 99}, protocol=2)[2:-1]
    with pytest.raises(ProtocolError, match="BUILD"):
        judge.decode(pickle.dumps((b"\x80\x02" + pid + state + b"b.", {}), protocol=5))
    assert judge.exported(handle).num_preemptions == 0

    class Boom:
        def __reduce__(self):
            return (print, ("ran in the judge",))

    with pytest.raises(ProtocolError):
        raw(pickle.dumps(Boom(), protocol=5))
    with pytest.raises(ProtocolError):
        raw(pickle.dumps(bytearray(8), protocol=5))  # sized by the sender: refused


def test_containers_nested_too_deep_are_refused_before_anything_is_built():
    deep = b"\x80\x05K\x01" + b"\x85" * 100_000 + b"."  # a tuple 100,000 deep: would crash a hash
    with pytest.raises(ProtocolError, match="nested"):
        check_opcodes(deep)
    fine = b"\x80\x05K\x01" + b"\x85" * (MAX_DEPTH - 1) + b"."
    check_opcodes(fine)


def test_a_tensor_names_only_a_known_dtype_a_cpu_and_memory_inside_its_storage():
    judge = Connection(-1, -1, JUDGE)
    resolve = judge._resolve({1: torch.zeros(16, dtype=torch.uint8)})
    with pytest.raises(ProtocolError, match="dtype"):
        resolve(("T", 1, "onnx", (2,), (1,), 0, "cpu"))  # torch's getattr would import torch.onnx
    with pytest.raises(ProtocolError, match="past the end"):
        resolve(("T", 1, "float32", (10**6,), (1,), 0, "cpu"))
    assert resolve(("T", 1, "float32", (4,), (1,), 0, "cpu")).shape == (4,)
    from kvlab.grading.wire import build_storages

    with pytest.raises(ProtocolError, match="device"):
        build_storages({1: ("meta", b"\0" * 4)})


def test_an_error_the_learner_describes_is_never_one_that_ends_the_judge():
    exit_ = rebuild_error({"mro": [("builtins", "SystemExit")], "args": [0], "code": 0})
    assert isinstance(exit_, LearnerExit) and isinstance(exit_, Exception) and exit_.code == 0
    for module, name in [
        ("builtins", "KeyboardInterrupt"),
        ("kvlab.grading.limits", "CheckTimeout"),
        ("kvlab.grading.remote", "RemoteDied"),
    ]:
        error = rebuild_error({"mro": [(module, name)], "args": ["x"]})
        assert type(error) is Exception, name
    assert (
        type(
            rebuild_error({"mro": [("kvlab.core.block_manager", "OutOfBlocks")], "args": []})
        ).__name__
        == "OutOfBlocks"
    )


def test_an_argument_the_call_left_alone_is_left_alone():
    """The copy-back of a dict of cached blocks it did not change: untouched (not replaced)."""
    cached = {123: CachedBlock(7, 0, (1, 2, 3, 4))}
    block = cached[123]
    judge = Connection(-1, -1, JUDGE)
    judge._copy_back({}, ({}, [None]), [cached])
    assert cached[123] is block


def test_what_a_hint_reads_of_bytecode_is_plain_data_and_a_wrong_shape_is_none():
    """The "code" request's answer (kvlab.grading.remote.code_shape) travels as plain data; a
    learner's process that answers otherwise gives no bytecode hint, never an error."""
    from kvlab.grading.remote import _checked_shape, code_of, code_shape

    def take(queue):
        queue = queue[1:]
        return queue

    shape = code_of(take)
    assert shape["co_argcount"] == 1 and shape["co_varnames"] == ["queue"]
    assert ("STORE_FAST", "queue") in shape["instructions"]
    got, _ = learner_sends(code_shape(take.__code__))
    assert _checked_shape(got) == shape
    assert code_of(len) is None and code_of(object()) is None
    for wrong in (
        None,
        {"co_argcount": "1", "co_varnames": [], "instructions": []},
        {"co_argcount": 1, "co_varnames": [3], "instructions": []},
        {"co_argcount": 1, "co_varnames": [], "instructions": [("LOAD_ATTR", ["x"])]},
        {"co_argcount": 1, "co_varnames": [], "instructions": [("NOP", None)] * 10**5},
    ):
        assert _checked_shape(wrong) is None
