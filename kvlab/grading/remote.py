"""Calls across the boundary between the judge and the learner's process.

One :class:`Connection` per side, over two pipes. Either side may call the other while it is
itself being called (the judge calls the learner's ``step(scheduler)``; the learner's code calls
``scheduler.preempt()``, which runs in the judge): a side waiting for a reply serves requests
in the meantime. What a side hands out by reference lives in its ``exports``; the other side
holds a proxy (:class:`Remote` in the judge, :class:`JudgeRef` in the learner's process) whose
every use is a request. Arguments of a call that travel by value (lists, dicts, tensors) come
back after it, so a function that fills or changes them does so as it would in one process.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import pickle
import sys
import types

from kvlab.grading import wire
from kvlab.grading.limits import CheckTimeout
from kvlab.grading.wire import ProtocolError

JUDGE, LEARNER = "judge", "learner"
MUTABLE = (list, dict, set, collections.deque, collections.OrderedDict)
ATOMIC = frozenset((type(None), bool, int, float, str, bytes))  # exact types: pickled as they are


class RemoteDied(Exception):
    """The learner's process ended (a crash, a limit, an exit) while the judge waited on it,
    or broke the protocol (wrote on the channel itself): either way it is stopped."""

    def __init__(self, how: str, broke_protocol: bool = False):
        super().__init__(how)
        self.how, self.broke_protocol = how, broke_protocol


@dataclasses.dataclass
class Printed:
    """What the learner's code printed during one request (the first ``keep`` characters)."""

    text: str = ""
    total: int = 0


class Connection:
    def __init__(self, read_fd: int, write_fd: int, side: str):
        self.read_fd, self.write_fd, self.side = read_fd, write_fd, side
        self.exports: dict[int, object] = {}
        self._export_ids: dict[int, int] = {}  # id(obj) -> handle
        self.proxies: dict[int, object] = {}
        self.handlers: dict[str, object] = {}  # extra operations this side serves
        self.on_printed = None  # the judge: where the learner's printing goes
        self.on_died = None  # the judge: how the learner's process ended, in words
        self.broken = False
        self.storages: list[dict] = []  # per request being served: its rebuilt storages
        self.pending_back = None  # what a call that raised left of its arguments
        self.serve_guard = None  # the judge: () -> a guard around each request it serves, or None
        # the learner's side: (conn, target, args, kwargs) -> a "call" request's reply, given by
        # kvlab.grading.judge_child (which imports this module, so it is never imported here)
        self.call_learner = None

    # --- handles ---------------------------------------------------------------------------
    def export(self, obj) -> int:
        handle = self._export_ids.get(id(obj))
        if handle is None or self.exports.get(handle) is not obj:
            handle = len(self.exports) + 1
            while handle in self.exports:
                handle += 1
            self.exports[handle] = obj
            self._export_ids[id(obj)] = handle
        return handle

    def exported(self, handle):
        if not isinstance(handle, int) or handle not in self.exports:
            raise ProtocolError(f"no object {handle!r} was handed out")
        return self.exports[handle]

    def release_all(self) -> None:
        self.exports.clear()
        self._export_ids.clear()
        self.proxies.clear()

    # --- encoding --------------------------------------------------------------------------
    def _special(self, storages: dict, by_reference: bool, target=None):
        def special(obj):
            if type(obj) in ATOMIC:  # pickle asks for every object: most are these, always plain
                return None
            first = obj is target
            if wire.is_tensor(obj):
                return wire.tensor_id(obj, storages)
            pid = getattr(type(obj), "_kvlab_pid", None)  # a proxy found again by name
            if pid is not None and isinstance(obj, (_Proxy, _RemoteMeta)):
                return pid(obj, self)
            if isinstance(obj, (Remote, JudgeRef)):
                if obj._conn is self:
                    return ("P", obj._handle)
                raise ProtocolError("a proxy of another connection")
            if isinstance(obj, _RemoteMeta):
                if obj._kvlab_remote is self:
                    return ("P", obj._kvlab_handle)
                raise ProtocolError("a class of another connection")
            if self.side == JUDGE:
                return self._judge_special(obj, first and by_reference)
            return self._learner_special(obj, first and by_reference)

        return special

    def _judge_special(self, obj, containers_by_reference: bool):
        """What the judge sends by reference: kvlab's live objects (a scheduler, a cache, a
        sequence), functions and methods, and the containers they hold when asked for them."""
        if containers_by_reference and type(obj) in MUTABLE:
            return ("R", self.export(obj), _info(obj))
        if _bound_or_local(obj) or _live_kvlab(obj):
            return ("R", self.export(obj), _info(obj))
        return None

    def _learner_special(self, obj, aliased: bool):
        """What the learner's side sends: plain data as it is, kvlab's enums and dataclasses by
        name and fields, numbers of NumPy as Python's; everything else by handle."""
        kind = type(obj)
        if kind in wire.PLAIN_TYPES:
            if aliased and kind is list:  # a key card the caller may change: changes go back
                return ("L", self.export(obj), list(obj))
            return None
        if isinstance(obj, BaseException):  # an error kept as a value (a refusal): by value
            return ("X", describe_error(obj, traceback=False))
        kvlab_value = _kvlab_value(obj)
        if kvlab_value is not None:
            return kvlab_value
        if isinstance(obj, collections.deque):
            return ("Q", list(obj))
        if isinstance(obj, complex):
            return ("Z", obj.real, obj.imag)
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(obj, numpy.generic) and obj.ndim == 0:
            value = obj.item()
            if type(value) in (bool, int, float):
                return ("V", value)
        for base in (bool, int, float, str, bytes, tuple, list, dict, set, frozenset):
            if isinstance(obj, base):  # a subclass (a namedtuple, a defaultdict): its plain value,
                return ("B", base(obj))  # so its own __eq__ decides nothing
        return ("R", self.export(obj), _info(obj))

    def _resolve(self, built: dict):
        def resolve(pid):
            tag = pid[0]
            step = _RESOLVE.get(tag) if isinstance(tag, str) else None
            if step is None or (tag in _JUDGE_READS and self.side != JUDGE):
                raise ProtocolError(f"an unknown reference {tag!r}")
            return step(self, pid, built)

        return resolve

    def _proxy(self, handle, info):
        if not isinstance(handle, int) or not isinstance(info, dict):
            raise ProtocolError("a malformed reference")
        proxy = self.proxies.get(handle)
        if proxy is None:
            proxy = remote_class(self, handle, info) if self.side == JUDGE else None
            if proxy is None:
                proxy = (Remote if self.side == JUDGE else JudgeRef)(self, handle, info)
            self.proxies[handle] = proxy
        return proxy

    def encode(self, message, by_reference: bool = False) -> tuple[bytes, dict]:
        """``by_reference``: a reply whose value, if a container, goes by reference (a
        scheduler's ``running`` list, which the learner's code changes in place)."""
        storages: dict = {}
        target = message[1] if by_reference and isinstance(message, tuple) else None
        body = wire.dumps(message, self._special(storages, by_reference, target))
        outer = pickle.dumps((body, wire.storage_table(storages)), protocol=5)
        return outer, storages

    def decode(self, data: bytes):
        """(message, rebuilt storages)."""
        trusted = self.side == LEARNER

        def no_references(pid):
            raise ProtocolError("a reference outside a message")

        outer = wire.loads(data, no_references, trusted)
        if not (isinstance(outer, tuple) and len(outer) == 2 and isinstance(outer[0], bytes)):
            raise ProtocolError("not a message")
        body, table = outer
        if not isinstance(table, dict):
            raise ProtocolError("not a message")
        built = wire.build_storages(table)
        return wire.loads(body, self._resolve(built), trusted), built

    # --- requests --------------------------------------------------------------------------
    def _send(self, message, by_reference: bool = False) -> dict:
        data, storages = self.encode(message, by_reference)
        try:
            wire.send(self.write_fd, data)
        except (BrokenPipeError, OSError) as e:
            self.broken = True
            raise RemoteDied(f"the channel closed ({e})") from None
        return storages

    def _receive(self):
        try:
            data = wire.recv(self.read_fd)
        except EOFError:
            self.broken = True
            how = self.on_died() if self.on_died is not None else "the channel closed"
            raise RemoteDied(how) from None
        except BaseException:
            self.broken = True  # interrupted mid-message (a time limit): the stream is lost
            raise
        return self.decode(data)

    def request(self, op: str, *args, copy_back=None):
        """Send ``(op, *args)`` and serve the other side until its reply; returns the value or
        raises what the other side raised. ``copy_back``: the call's by-value arguments, whose
        changes come back."""
        if self.broken:
            raise RemoteDied("the channel is closed")
        storages = self._send(("req", op, args))
        while True:
            try:
                reply = self._next_reply(storages, copy_back)
            except ProtocolError as e:
                if self.side == LEARNER:
                    raise
                self.broken = True  # whatever wrote that is not to be talked to again
                raise RemoteDied(f"it wrote on the grader's channel: {e}", True) from None
            except BaseException:
                self.broken = True
                raise
            if reply is None:  # a request of the other side's, served meanwhile
                continue
            kind, value = reply
            if kind == "err":
                raise self._error(value)
            return value

    def _next_reply(self, storages: dict, copy_back):
        """Read one message: a request of the other side's is served (None), a reply is
        ``(kind, value)`` once what it printed and what came back of the arguments are taken."""
        message, built = self._receive()
        if not isinstance(message, tuple) or not message:
            raise ProtocolError("not a message")
        kind = message[0]
        if kind == "req":
            self._serve(message, built)
            return None
        if kind not in ("ok", "err") or len(message) != 4:
            raise ProtocolError("not a reply")
        _, value, printed, back = message
        self._printed(printed)
        if back is not None:
            self._copy_back(storages, back, copy_back)
        return kind, value

    def _printed(self, printed) -> None:
        if self.on_printed is not None and isinstance(printed, tuple) and len(printed) == 2:
            text, total = printed
            if isinstance(text, str) and type(total) is int:
                self.on_printed(Printed(text[:2000], max(0, total)))

    def _copy_back(self, storages: dict, back, arguments) -> None:
        if not (isinstance(back, tuple) and len(back) == 2):
            raise ProtocolError("a malformed copy-back")
        table, values = back
        if isinstance(table, dict):
            wire.copy_back(storages, table)
        if arguments is not None and isinstance(values, list):
            for original, value in zip(arguments, values, strict=False):
                if value is not None:  # None: the call left it as it was
                    _assign(original, value)

    def _error(self, info) -> BaseException:
        if self.side == LEARNER:
            return info if isinstance(info, BaseException) else RuntimeError(str(info))
        return rebuild_error(info)

    # --- serving ---------------------------------------------------------------------------
    def serve_forever(self) -> None:
        """The learner's side: answer the judge until it closes the channel."""
        while True:
            try:
                message, built = self._receive()
            except RemoteDied:
                return
            if isinstance(message, tuple) and message and message[0] == "req":
                self._serve(message, built)

    def _serve(self, message, built: dict) -> None:
        try:
            _, op, args = message
        except ValueError:
            raise ProtocolError("a malformed request") from None
        self.storages.append(built)  # the request's tensors, for what goes back after a call
        guard = self.serve_guard() if self.serve_guard is not None else None
        try:
            if guard is None:
                self._answer(op, args)
            else:  # the judge: kvlab's own answer to the exercise checked now is refused
                with guard:
                    self._answer(op, args)
        finally:
            self.storages.pop()

    def _answer(self, op, args) -> None:
        handler = self.handlers.get(op) or OPERATIONS.get(op)
        if handler is None:
            raise ProtocolError(f"an unknown operation {op!r}")
        self.pending_back = None
        try:
            value, by_reference, printed, back = handler(self, *args)
            reply = ("ok", value, printed, back)
        except ProtocolError:
            raise
        except BaseException as error:  # noqa: BLE001 (every error goes to the caller)
            if isinstance(error, (KeyboardInterrupt, CheckTimeout)):
                raise  # the judge's own time limit, never the learner's to catch
            printed, back, self.pending_back = None, self.pending_back, None
            reply, by_reference = ("err", self._describe(error), printed, back), False
        try:
            self._send(reply, by_reference)
        except (pickle.PicklingError, TypeError, AttributeError, ProtocolError) as e:
            failure = RuntimeError(f"a result that cannot be sent back: {type(e).__name__}: {e}")
            self._send(("err", self._describe(failure), printed, back))

    def _describe(self, error: BaseException):
        if self.side == JUDGE:  # the learner's side trusts the judge's exceptions
            try:
                pickle.dumps(error)
                return error
            except Exception:
                return RuntimeError(f"{type(error).__name__}: {error}")
        return describe_error(error)


# --- the operations both sides serve -------------------------------------------------------
# each returns (value, send containers by reference?, printed, copy-back)


def _call(conn, handle, args, kwargs):
    target = conn.exported(handle)
    if not isinstance(args, tuple) or not isinstance(kwargs, dict):
        raise ProtocolError("a malformed call")
    if conn.side == LEARNER and conn.call_learner is not None:
        return conn.call_learner(conn, target, args, kwargs)
    return target(*args, **kwargs), True, None, None


def _getattr(conn, handle, name):
    if not isinstance(name, str):
        raise ProtocolError("a malformed attribute")
    if conn.side == JUDGE and name.startswith("_"):
        raise AttributeError(f"{name!r}: the judge's private attributes are not yours to read")
    return getattr(conn.exported(handle), name), True, None, None


def _setattr(conn, handle, name, value):
    if not isinstance(name, str) or (conn.side == JUDGE and name.startswith("_")):
        raise AttributeError(f"{name!r} cannot be set from the other side")
    setattr(conn.exported(handle), name, value)
    return None, False, None, None


def _getitem(conn, handle, key):
    return conn.exported(handle)[key], True, None, None


def _setitem(conn, handle, key, value):
    conn.exported(handle)[key] = value
    return None, False, None, None


def _delitem(conn, handle, key):
    del conn.exported(handle)[key]
    return None, False, None, None


def _method(conn, handle, name, args):
    """A container's own method (``append``, ``pop``, ``sort``) on an exported container."""
    target = conn.exported(handle)
    if not isinstance(name, str) or name.startswith("_") or type(target) not in MUTABLE:
        raise ProtocolError("a malformed container method")
    return getattr(target, name)(*args), False, None, None


def _unary(name):
    def op(conn, handle):
        target = conn.exported(handle)
        functions = {"len": len, "iter": iter, "next": next, "repr": repr, "str": str}
        functions |= {"bool": bool, "hash": hash}
        return functions[name](target), name in ("iter", "next"), None, None

    return op


def _binary(name):
    def op(conn, handle, other):
        target = conn.exported(handle)
        if name == "eq":
            return target == other, False, None, None
        if name == "contains":
            return other in target, False, None, None
        raise ProtocolError(name)

    return op


OPERATIONS = {
    "call": _call,
    "getattr": _getattr,
    "setattr": _setattr,
    "getitem": _getitem,
    "setitem": _setitem,
    "delitem": _delitem,
    "method": _method,
    **{n: _unary(n) for n in ("len", "iter", "next", "repr", "str", "bool", "hash")},
    "eq": _binary("eq"),
    "contains": _binary("contains"),
}


# --- what a persistent id in a message stands for ----------------------------------------------


def _unknown(pid):
    raise ProtocolError(f"an unknown reference {pid[0]!r}")


def _plain_value(conn, pid, built):  # "V" a NumPy number, "B" a subclass's plain value
    return pid[1] if type(pid[1]) in wire.PLAIN_TYPES else _unknown(pid)


def _complex(conn, pid, built):
    return complex(pid[1], pid[2]) if all(type(x) is float for x in pid[1:]) else _unknown(pid)


def _deque(conn, pid, built):
    return collections.deque(pid[1]) if isinstance(pid[1], list) else _unknown(pid)


_RESOLVE = {
    "T": lambda conn, pid, built: wire.tensor_from(pid, built),
    "P": lambda conn, pid, built: conn.exported(pid[1]),
    "R": lambda conn, pid, built: conn._proxy(pid[1], pid[2]),
    "L": lambda conn, pid, built: RemoteList(conn, pid[1], pid[2]),
    "E": lambda conn, pid, built: wire.enum_from(pid),
    "D": lambda conn, pid, built: wire.data_from(pid),
    "V": _plain_value,
    "B": _plain_value,
    "Z": _complex,
    "Q": _deque,
    "N": lambda conn, pid, built: wire.named_from(pid),
    "X": lambda conn, pid, built: rebuild_error(pid[1], remote=False),
}
_JUDGE_READS = frozenset(
    "LNX"
)  # what only the learner's side sends: a list, a NamedTuple, an error


# --- what travels by reference, and the proxies --------------------------------------------


def _kvlab_value(obj):
    """kvlab's enums, dataclasses and NamedTuples, by name and fields (else None)."""
    if wire.is_kvlab_enum(obj):
        module, qualname = wire.kvlab_name(obj)
        return ("E", module, qualname, obj.name)
    if wire.is_kvlab_data(obj):
        return wire.data_id(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields") and wire.kvlab_name(obj):
        module, qualname = wire.kvlab_name(obj)  # a NamedTuple of kvlab's (CachedBlock)
        return ("N", module, qualname, tuple(obj))
    return None


def _live_kvlab(obj) -> bool:
    """kvlab's objects with state that calls change (not its enums, errors, frozen data or
    torch modules): they stay in the judge, the learner's code holds a proxy."""
    if wire.kvlab_name(obj) is None or isinstance(obj, (enum.Enum, BaseException, type)):
        return False
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.nn.Module):
        return False
    if dataclasses.is_dataclass(obj):
        return not type(obj).__dataclass_params__.frozen
    return not isinstance(obj, tuple)


def _bound_or_local(obj) -> bool:
    """A callable that cannot travel by name: a bound method, a lambda, a nested function (a
    module's own functions, pickle's ``copyreg.__newobj__`` among them, go by name)."""
    if isinstance(obj, types.MethodType):
        return True
    if isinstance(obj, types.FunctionType):
        return "<" in obj.__qualname__
    if isinstance(obj, types.BuiltinFunctionType):  # also bound built-in methods ([].append)
        owner = getattr(obj, "__self__", None)
        return owner is not None and not isinstance(owner, types.ModuleType)
    return type(obj).__name__ == "method-wrapper"


def _info(obj) -> dict:
    kind = type(obj)
    return {
        "type": kind.__name__,
        "module": str(getattr(obj, "__module__", None) or getattr(kind, "__module__", "")),
        "qualname": str(getattr(obj, "__qualname__", None) or kind.__qualname__),
        "name": str(getattr(obj, "__name__", None) or kind.__name__),
        "is_class": isinstance(obj, type),
        "callable": callable(obj),
        "repr": _safe_repr(obj),
    }


def _safe_repr(obj) -> str:
    try:
        text = repr(obj)
    except Exception as e:
        text = f"<{type(obj).__name__} whose repr raised {type(e).__name__}>"
    return text if len(text) <= 400 else text[:399] + "…"


def _assign(original, value) -> None:
    """Make the judge's by-value argument what the learner's side left of it."""
    if isinstance(original, list) and isinstance(value, list):
        original[:] = value
    elif isinstance(original, dict) and isinstance(value, dict):
        original.clear()
        original.update(value)
    elif isinstance(original, set) and isinstance(value, set):
        original.clear()
        original.update(value)
    elif isinstance(original, collections.deque) and isinstance(value, collections.deque):
        original.clear()
        original.extend(value)


class _Proxy:
    """Forwards what Python does with an object to the side that holds it."""

    __slots__ = ("_conn", "_handle", "_info", "__weakref__")

    def __init__(self, conn, handle, info):
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_handle", handle)
        object.__setattr__(self, "_info", info)

    def _ask(self, op, *args, **options):
        return self._conn.request(op, self._handle, *args, **options)

    def __getattr__(self, name):
        if (name.startswith("__") and name.endswith("__")) or name.startswith("_kvlab"):
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __setattr__(self, name, value):
        self._ask("setattr", name, value)

    def __call__(self, *args, **kwargs):
        return self._ask("call", args, kwargs, copy_back=[*args, *kwargs.values()])

    def __getitem__(self, key):
        return self._ask("getitem", key)

    def __setitem__(self, key, value):
        self._ask("setitem", key, value)

    def __delitem__(self, key):
        self._ask("delitem", key)

    def __len__(self):
        return self._ask("len")

    def __iter__(self):
        return self._ask("iter")

    def __next__(self):
        return self._ask("next")

    def __contains__(self, item):
        return self._ask("contains", item)

    def __bool__(self):
        return self._ask("bool")

    def __eq__(self, other):
        if isinstance(other, _Proxy) and other._conn is self._conn:
            if other._handle == self._handle:
                return True
        return self._ask("eq", other)

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return self._ask("hash")

    def __repr__(self):
        return self._ask("repr")

    def __str__(self):
        return self._ask("str")

    def __copy__(self):  # a copy of a scheduler holding a proxy holds the same proxy
        return self

    def __deepcopy__(self, memo):
        return self


class Remote(_Proxy):
    """The judge's view of one of the learner's objects (a function, an instance, a kernel).
    Where it was defined is :func:`origin`: ``__module__`` here is this module's.

    It equals only itself: numbers, strings, lists and tensors come by value, so anything that
    arrives as a proxy is an object of the learner's, and its own ``__eq__`` (one that says
    True to everything) must not decide a check."""

    __slots__ = ()

    def __eq__(self, other):
        return self is other

    def __hash__(self):
        return id(self)

    @property
    def __name__(self):
        return self._info["name"]


class JudgeRef(_Proxy):
    """The learner's view of one of the judge's objects (a scheduler, a cache, a sequence)."""

    __slots__ = ()


class RemoteList(list):
    """A list the learner's code returned: a copy here, whose changes are made there too, so
    a caller changing a returned key card changes the learner's list if it is their own."""

    def __init__(self, conn, handle, items):
        if not isinstance(items, list) or not isinstance(handle, int):
            raise ProtocolError("a malformed list")
        super().__init__(items)
        self._conn, self._handle = conn, handle

    def _both(self, name, *args):
        result = getattr(super(), name)(*args)
        self._conn.request("method", self._handle, name, args)
        return result

    def append(self, item):
        return self._both("append", item)

    def extend(self, items):
        return self._both("extend", list(items))

    def insert(self, index, item):
        return self._both("insert", index, item)

    def pop(self, index=-1):
        return self._both("pop", index)

    def remove(self, item):
        return self._both("remove", item)

    def clear(self):
        return self._both("clear")

    def reverse(self):
        return self._both("reverse")

    def sort(self, *, key=None, reverse=False):
        super().sort(key=key, reverse=reverse)
        self._conn.request("setitem", self._handle, slice(None), list(self))

    def __setitem__(self, index, value):
        super().__setitem__(index, value)
        self._conn.request("setitem", self._handle, index, value)

    def __delitem__(self, index):
        super().__delitem__(index)
        self._conn.request("delitem", self._handle, index)

    def __iadd__(self, items):
        self.extend(items)
        return self

    def __reduce__(self):  # a copy of it is a plain list
        return (list, (list(self),))


class _RemoteMeta(type):
    """The type of a learner's class as the judge sees it: its attributes are asked for."""

    def _kvlab_ask(cls, op, *args, **options):
        return cls._kvlab_remote.request(op, cls._kvlab_handle, *args, **options)

    def __getattr__(cls, name):
        if name.startswith(("__", "_kvlab")):
            raise AttributeError(name)
        return cls._kvlab_ask("getattr", name)

    def __call__(cls, *args, **kwargs):
        return cls._kvlab_ask("call", args, kwargs, copy_back=[*args, *kwargs.values()])

    def __repr__(cls):
        return cls._kvlab_info["repr"]


def remote_class(conn, handle, info):
    """A class of the learner's, as a class here (``isinstance(obj, type)`` holds), or None
    for anything else."""
    if not info.get("is_class"):
        return None
    namespace = {
        "_kvlab_remote": conn,
        "_kvlab_handle": handle,
        "_kvlab_info": info,
        "__module__": info["module"],
        "__qualname__": info["qualname"],
    }
    return _RemoteMeta(info["name"], (), namespace)


def is_remote(obj) -> bool:
    return isinstance(obj, (Remote, _RemoteMeta))


def connection_of(obj):
    """The connection a proxy talks over (None for a proxy found again by name, whose
    connection changes when the learner's process restarts)."""
    if isinstance(obj, Remote):
        return obj._conn
    if isinstance(obj, _RemoteMeta):
        return getattr(obj, "_kvlab_remote", None)
    return None


# --- errors ----------------------------------------------------------------------------------


def describe_error(error: BaseException, traceback: bool = True) -> dict:
    """The learner's side: what the judge needs of an error (its classes, message, the line of
    the learner's code it came from), computed here where the traceback is."""
    from kvlab.grading.blame import (
        exception_cause,
        explain_exception,
        learner_frames,
        triton_too_early,
        unwritten,
    )

    attrs = {
        k: v
        for k, v in getattr(error, "__dict__", {}).items()
        if type(v) in (bool, int, float, str, type(None)) and not k.startswith("_")
    }
    described = {
        "mro": [(c.__module__, c.__qualname__) for c in type(error).__mro__],
        "args": [
            a if type(a) in (bool, int, float, str, type(None)) else repr(a) for a in error.args
        ],
        "attrs": attrs,
        "code": error.code if isinstance(error, SystemExit) else None,
    }
    if not traceback:
        return described
    return described | {
        "lines": explain_exception(error),
        "cause": exception_cause(error),
        "learner": bool(learner_frames(error)),
        "unwritten": unwritten(error) if isinstance(error, NotImplementedError) else None,
        "too_early": triton_too_early(error),
    }


class LearnerExit(Exception):
    """``exit()`` or ``SystemExit`` in the learner's code, as the judge holds it: an ordinary
    error here, never one that ends the judge."""

    def __init__(self, *args, code=None):
        super().__init__(*args)
        self.code = code


def _known_exception(module: str, qualname: str):
    """Exception classes the judge rebuilds by name: Python's and kvlab's own errors, never
    one of the grader's (a time limit, a dead process) nor one that is not an Exception."""
    import builtins

    if module == "builtins" and qualname == "SystemExit":
        return LearnerExit
    found = None
    if module == "builtins" and "." not in qualname:
        found = getattr(builtins, qualname, None)
    elif module.startswith("kvlab.") and not module.startswith("kvlab.grading"):
        try:
            found = wire.find_kvlab(module, qualname)
        except (ProtocolError, AttributeError):
            found = None
    return found if isinstance(found, type) and issubclass(found, Exception) else None


ERROR_TEXT = 1000  # characters of one string the learner's side says of an error
ERROR_ITEMS = 8  # arguments, attributes and lines of it kept


def _short(text: str) -> str:
    return text if len(text) <= ERROR_TEXT else text[: ERROR_TEXT - 1] + "…"


def _bounded(info: dict) -> dict:
    """What the learner's side said of an error, cut to what a report shows: a patched
    ``describe_error`` may send any amount of text, the feedback keeps a few lines of it."""
    out = {}
    for key in ("lines", "cause", "learner", "unwritten", "too_early", "code"):
        value = info.get(key)
        if isinstance(value, list):
            value = [_short(str(v)) for v in value[:ERROR_ITEMS]]
        elif isinstance(value, str):
            value = _short(value)
        elif type(value) not in (bool, int, float, type(None)):
            value = None
        out[key] = value
    return out


def rebuild_error(info, remote: bool = True) -> BaseException:
    """The judge's side: an exception of the nearest class it knows (builtins, kvlab.core.errors),
    carrying what the learner's side said of it."""
    if not isinstance(info, dict) or not isinstance(info.get("mro"), list):
        return ProtocolError("a malformed error")
    cls = None
    for entry in info["mro"]:
        if isinstance(entry, (tuple, list)) and len(entry) == 2:
            cls = _known_exception(*map(str, entry))
            if cls is not None:
                break
    cls = cls or Exception
    error = cls.__new__(cls)
    args = info.get("args") if isinstance(info.get("args"), list) else []
    args = [
        _short(a) if type(a) is str else a
        for a in args[:ERROR_ITEMS]
        if type(a) in (bool, int, float, str)
    ]
    BaseException.__init__(error, *args)
    attrs = info.get("attrs") if isinstance(info.get("attrs"), dict) else {}
    for key, value in list(attrs.items())[:ERROR_ITEMS]:
        value = _short(value) if type(value) is str else value
        if isinstance(key, str) and not key.startswith("_"):
            try:
                object.__setattr__(error, key, value)
            except (AttributeError, TypeError):
                pass
    if cls is LearnerExit:
        code = info.get("code")
        error.code = code if type(code) in (int, str, type(None)) else None
    if remote:  # raised by the learner's code: what it said of its traceback
        error.__kvlab_remote__ = _bounded(info)
    return error


def origin(obj) -> str | None:
    """``module.qualname`` of the learner's object behind a proxy (None for anything else)."""
    info = getattr(obj, "_kvlab_info", None) if isinstance(obj, _RemoteMeta) else None
    if isinstance(obj, Remote):
        info = obj._info
    return None if info is None else f"{info['module']}.{info['qualname']}"


# --- what hints read of a function's bytecode ------------------------------------------------

CODE_ITEMS = 10_000  # instructions of one function a hint reads


def code_shape(code: types.CodeType) -> dict:
    """What hints read of a function's bytecode, as plain data: its argument count, its
    local names and its instructions as (opname, argval), an argval that is not plain as its
    repr. The learner's process computes it for the judge (the "code" request)."""
    import dis

    def plain(value):
        return value if type(value) in (bool, int, float, str, type(None)) else repr(value)

    return {
        "co_argcount": code.co_argcount,
        "co_varnames": list(code.co_varnames),
        "instructions": [(i.opname, plain(i.argval)) for i in dis.get_instructions(code)],
    }


def code_of(fn) -> dict | None:
    """:func:`code_shape` of ``fn``'s code, the same for a function of this process and for one
    of the learner's behind a proxy (asked for with the "code" request, read as data and
    checked): a hint read from bytecode fires under ``kvlab grade`` as in the notebook. None
    for an object without code, or a reply that is not that shape."""
    if isinstance(fn, Remote):
        return _checked_shape(fn._ask("code"))
    code = getattr(fn, "__code__", None)
    return code_shape(code) if isinstance(code, types.CodeType) else None


def _checked_shape(shape) -> dict | None:
    if not isinstance(shape, dict) or type(shape.get("co_argcount")) is not int:
        return None
    names, instructions = shape.get("co_varnames"), shape.get("instructions")
    if not isinstance(names, list) or not all(type(n) is str for n in names):
        return None
    if not isinstance(instructions, list) or len(instructions) > CODE_ITEMS:
        return None
    plain = (bool, int, float, str, type(None))
    if not all(
        isinstance(i, tuple) and len(i) == 2 and type(i[0]) is str and type(i[1]) in plain
        for i in instructions
    ):
        return None
    return {"co_argcount": shape["co_argcount"], "co_varnames": names, "instructions": instructions}
