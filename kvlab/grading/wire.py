"""What crosses between the judge and the learner's process, and how it is read back.

Messages are length-prefixed pickles. Each side decides what it sends by value and what by
reference (a handle the other side turns into a proxy); tensors travel as their storages, so
views, shared storage and the guard regions around an output survive the trip, and a storage
the other side changed can be copied back in place.

The judge never unpickles the learner's bytes with pickle's full power (that would run any code
the bytes name): :class:`JudgeUnpickler` finds only plain containers, and everything else comes
as a persistent id the judge resolves itself (a tensor, a kvlab enum or dataclass, one of the
judge's own objects, a handle to a learner object). A message it cannot read that way is a
protocol error, never code run in the judge.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import os
import pickle
import struct
import sys

HEADER = struct.Struct("!Q")
MAX_MESSAGE = 1 << 28  # 256 MiB: a bigger message is a broken or hostile peer
# exact types pickled with constants and container opcodes only (a learner's subclasses go as
# their plain base, kvlab's NamedTuples by name and fields, deques and complex numbers by tag)
PLAIN_TYPES = frozenset(
    (type(None), bool, int, float, str, bytes, list, tuple, dict, set, frozenset)
)


class ProtocolError(Exception):
    """The other side sent something that is not a message (a broken or hostile peer)."""


# --- framing ---------------------------------------------------------------------------------


def send(fd: int, payload: bytes) -> None:
    data = HEADER.pack(len(payload)) + payload
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exactly(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv(fd: int) -> bytes:
    (size,) = HEADER.unpack(_read_exactly(fd, HEADER.size))
    if size > MAX_MESSAGE:
        raise ProtocolError(f"a message of {size:,} bytes")
    return _read_exactly(fd, size)


# --- tensors ---------------------------------------------------------------------------------


def _torch():
    return sys.modules.get("torch")


def is_tensor(obj) -> bool:
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


def storage_key(tensor) -> int:
    return tensor.untyped_storage().data_ptr() or id(tensor.untyped_storage())


def storage_bytes(tensor) -> bytes:
    """The tensor's whole storage, as bytes (on the CPU). Read through a uint8 view, not
    ``bytes(storage)``, which calls Python for every byte (seconds for a cache of a few MB)."""
    import torch

    storage = tensor.untyped_storage()
    flat = torch.empty(0, dtype=torch.uint8, device=storage.device)
    flat.set_(storage, 0, (storage.nbytes(),), (1,))
    return flat.cpu().numpy().tobytes()


def tensor_id(tensor, storages: dict) -> tuple:
    """A tensor as (storage key, dtype, size, stride, offset, device); its storage goes into
    ``storages`` once, however many tensors view it."""
    key = storage_key(tensor)
    if key not in storages:
        storages[key] = (tensor, storage_bytes(tensor))
    dtype = str(tensor.dtype).removeprefix("torch.")
    return (
        "T",
        key,
        dtype,
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.storage_offset(),
        str(tensor.device),
    )


def _dtypes() -> dict:
    import torch

    return {
        str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)
    }


def _device(name) -> str:
    """The CPU, or a CUDA GPU where this process has one: nothing else is built from a name."""
    import torch

    if name == "cpu":
        return name
    if isinstance(name, str) and torch.cuda.is_available():
        head, _, index = name.partition(":")
        count = torch.cuda.device_count()
        if head == "cuda" and (not index or (index.isdigit() and int(index) < count)):
            return name
    raise ProtocolError(f"a storage on the device {name!r}")


def build_storages(table: dict) -> dict:
    """Storages from ``{key: (device, bytes)}``, each a uint8 tensor over its bytes."""
    if isinstance(table, dict) and not table:
        return {}  # no tensor in the message: no need to import torch (two seconds) for it
    import torch

    built = {}
    for key, entry in table.items():
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise ProtocolError("a malformed storage")
        device, raw = entry
        if not isinstance(raw, bytes):
            raise ProtocolError("a storage is not bytes")
        device = _device(device)
        try:
            flat = (
                torch.frombuffer(bytearray(raw), dtype=torch.uint8)
                if raw
                else torch.empty(0, dtype=torch.uint8)
            )
            built[key] = flat.to(device) if device != "cpu" else flat
        except Exception as e:
            raise ProtocolError(f"a storage that cannot be built ({type(e).__name__})") from None
    return built


def tensor_from(pid: tuple, built: dict):
    """The tensor a ``tensor_id`` names, a view of its storage as rebuilt."""
    import torch

    try:
        _, key, dtype, size, stride, offset, _device = pid
    except ValueError:
        raise ProtocolError("a malformed tensor") from None
    if key not in built:
        raise ProtocolError("a tensor without its storage")
    dtype = _dtypes().get(dtype) if isinstance(dtype, str) else None
    if dtype is None:  # looked up in a table: torch's own getattr would import modules
        raise ProtocolError("a tensor of an unknown dtype")
    if not all(isinstance(n, int) and n >= 0 for n in (*size, *stride, offset)):
        raise ProtocolError("a tensor of a malformed shape")
    base = built[key]
    if base.numel() % torch.empty((), dtype=dtype).element_size():
        raise ProtocolError("a storage that does not hold whole elements")
    typed = base.view(dtype)
    if all(size):
        reach = offset + sum((n - 1) * st for n, st in zip(size, stride, strict=True))
        if reach >= typed.numel():
            raise ProtocolError("a tensor past the end of its storage")
    try:
        return typed.as_strided(tuple(size), tuple(stride), int(offset))
    except Exception as e:
        raise ProtocolError(f"a tensor that cannot be built ({type(e).__name__})") from None


def storage_table(storages: dict) -> dict:
    """What travels of ``tensor_id``'s storages: ``{key: (device, bytes)}``."""
    return {key: (str(t.device), raw) for key, (t, raw) in storages.items()}


def copy_back(originals: dict, table: dict) -> None:
    """Write storages the other side changed into ours, in place (``originals``: key ->
    (tensor, bytes sent))."""
    import torch

    for key, (_device, raw) in table.items():
        if key not in originals:
            continue
        tensor, sent = originals[key]
        if raw == sent:
            continue
        storage = tensor.untyped_storage()
        if len(raw) != storage.nbytes():
            raise ProtocolError("a storage came back with another size")
        fresh = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        target = torch.empty(0, dtype=torch.uint8, device=storage.device)
        target.set_(storage, 0, (storage.nbytes(),), (1,))
        target.copy_(fresh.to(storage.device))


# --- kvlab's own enums and data --------------------------------------------------------------


def kvlab_name(obj) -> tuple[str, str] | None:
    cls = type(obj)
    module = getattr(cls, "__module__", "") or ""
    if module == "kvlab" or module.startswith("kvlab."):
        return module, cls.__qualname__
    return None


def find_kvlab(module: str, qualname: str):
    """A class of kvlab's by name (nothing else: the name comes from the other side)."""
    if not (module == "kvlab" or module.startswith("kvlab.")) or "<" in qualname:
        raise ProtocolError(f"{module}.{qualname} is not kvlab's")
    owner = sys.modules.get(module)  # never an import: a module's import may run code
    if owner is None:
        raise ProtocolError(f"{module} is not loaded here")
    for part in qualname.split("."):
        if part.startswith("_"):
            raise ProtocolError(f"{module}.{qualname} is private")
        owner = getattr(owner, part, None)
    if not isinstance(owner, type):
        raise ProtocolError(f"{module}.{qualname} is not a class")
    return owner


def is_kvlab_enum(obj) -> bool:
    return isinstance(obj, enum.Enum) and kvlab_name(obj) is not None


def is_kvlab_data(obj) -> bool:
    """A kvlab dataclass instance (data that can be rebuilt field by field)."""
    return (
        dataclasses.is_dataclass(obj) and not isinstance(obj, type) and kvlab_name(obj) is not None
    )


def data_id(obj) -> tuple:
    module, qualname = kvlab_name(obj)
    fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return ("D", module, qualname, fields)


def data_from(pid: tuple):
    _, module, qualname, fields = pid
    cls = find_kvlab(module, qualname)
    if not dataclasses.is_dataclass(cls) or not isinstance(fields, dict):
        raise ProtocolError(f"{qualname} is not a kvlab dataclass")
    names = {f.name for f in dataclasses.fields(cls)}
    if set(fields) != names:
        raise ProtocolError(f"{qualname} with other fields")
    obj = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(obj, name, value)
    return obj


def enum_from(pid: tuple):
    _, module, qualname, name = pid
    cls = find_kvlab(module, qualname)
    if not issubclass(cls, enum.Enum) or not isinstance(name, str) or name not in cls.__members__:
        raise ProtocolError(f"{qualname}.{name} is not a kvlab enum member")
    return cls[name]


# --- picklers --------------------------------------------------------------------------------


class Writer(pickle.Pickler):
    """Pickles a message; ``special(obj)`` gives a persistent id for what must not be pickled
    as it is (or None)."""

    def __init__(self, buffer, special):
        super().__init__(buffer, protocol=5)
        self.special = special

    def persistent_id(self, obj):
        return self.special(obj)


def dumps(obj, special) -> bytes:
    buffer = io.BytesIO()
    Writer(buffer, special).dump(obj)
    return buffer.getvalue()


class ChildUnpickler(pickle.Unpickler):
    """The learner's side reads the judge's messages (trusted) with its persistent ids."""

    def __init__(self, data: bytes, resolve):
        super().__init__(io.BytesIO(data))
        self.resolve = resolve

    def persistent_load(self, pid):
        return self.resolve(pid)


# The opcodes a learner's message may hold: constants, containers, memo and persistent ids.
# No GLOBAL, REDUCE, BUILD, NEWOBJ or INST: nothing is looked up by name, no callable is called
# and no object's state is set, so a message can neither run code nor change an object it names.
SAFE_OPCODES = frozenset(
    """PROTO FRAME STOP MARK POP POP_MARK DUP NONE NEWTRUE NEWFALSE INT BININT BININT1 BININT2
    LONG LONG1 LONG4 FLOAT BINFLOAT BINUNICODE SHORT_BINUNICODE BINUNICODE8 UNICODE BINBYTES
    SHORT_BINBYTES BINBYTES8 BINSTRING SHORT_BINSTRING EMPTY_LIST APPEND APPENDS LIST EMPTY_TUPLE
    TUPLE TUPLE1 TUPLE2 TUPLE3 EMPTY_DICT DICT SETITEM SETITEMS EMPTY_SET ADDITEMS FROZENSET
    MEMOIZE PUT BINPUT LONG_BINPUT GET BINGET LONG_BINGET BINPERSID""".split()
)
MAX_DEPTH = 64  # containers inside containers: C code hashes and compares them recursively
_MARK = object()


# Small messages already found safe: the verdict is the bytes' own (the same bytes, the same
# opcodes), and a judge asks the learner's code the same small things many times over (Lab 06's
# day is tens of thousands of calls).
_SAFE_SEEN: dict[bytes, None] = {}
_SAFE_SEEN_MAX_BYTES, _SAFE_SEEN_MAX = 256, 8192


def check_opcodes(data: bytes) -> None:
    """Refuse a learner's pickle with an opcode outside :data:`SAFE_OPCODES`, or containers
    nested deeper than :data:`MAX_DEPTH` (a tuple nested a million deep crashes the reader when
    it is hashed). A small stack machine follows each value's depth."""
    small = type(data) is bytes and len(data) <= _SAFE_SEEN_MAX_BYTES
    if small and data in _SAFE_SEEN:
        return
    _check_opcodes(data)
    if small:
        if len(_SAFE_SEEN) >= _SAFE_SEEN_MAX:
            _SAFE_SEEN.clear()
        _SAFE_SEEN[data] = None


def _check_opcodes(data: bytes) -> None:
    import pickletools

    machine = _Depths()
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name not in SAFE_OPCODES:
                raise ProtocolError(f"a pickle with {op.name}")
            _STEPS.get(op.name, _Depths.constant)(machine, op.name, arg)
    except ProtocolError:
        raise
    except Exception as e:  # truncated or malformed
        raise ProtocolError(f"a malformed pickle ({type(e).__name__})") from None


class _Depths:
    """The stack machine of :func:`check_opcodes`: each value on the pickle's stack stands as
    how deep its containers go (0: a constant or a persistent id), each mark as ``_MARK``."""

    def __init__(self):
        self.stack: list = []
        self.memo: dict = {}

    def _pop_mark(self) -> list:
        stack, items = self.stack, []
        while stack and stack[-1] is not _MARK:
            items.append(stack.pop())
        if not stack:
            raise ProtocolError("a pickle without its mark")
        stack.pop()
        return items

    @staticmethod
    def _deep(items) -> int:
        depth = 1 + max(items, default=0)
        if depth > MAX_DEPTH:
            raise ProtocolError(f"containers nested more than {MAX_DEPTH} deep")
        return depth

    def _fill(self, items) -> None:  # items added to the container below them
        self.stack[-1] = max(self.stack[-1], self._deep(items))

    def nothing(self, name, arg):  # PROTO, FRAME, STOP
        pass

    def constant(self, name, arg):
        self.stack.append(0)

    def mark(self, name, arg):
        self.stack.append(_MARK)

    def pop(self, name, arg):
        self.stack.pop()

    def pop_mark(self, name, arg):
        self._pop_mark()

    def dup(self, name, arg):
        self.stack.append(self.stack[-1])

    def empty(self, name, arg):
        self.stack.append(1)

    def append(self, name, arg):
        self._fill([self.stack.pop()])

    def setitem(self, name, arg):
        value, key = self.stack.pop(), self.stack.pop()
        self._fill([key, value])

    def add_marked(self, name, arg):  # APPENDS, SETITEMS, ADDITEMS
        self._fill(self._pop_mark())

    def build_marked(self, name, arg):  # LIST, TUPLE, DICT, FROZENSET
        self.stack.append(self._deep(self._pop_mark()))

    def tuple_n(self, name, arg):  # TUPLE1, TUPLE2, TUPLE3
        self.stack.append(self._deep([self.stack.pop() for _ in range(int(name[-1]))]))

    def persistent_id(self, name, arg):
        self.stack[-1] = 0  # the id's tuple becomes what it names, built by the judge

    def put(self, name, arg):
        self.memo[len(self.memo) if name == "MEMOIZE" else arg] = self.stack[-1]

    def get(self, name, arg):
        self.stack.append(self.memo[arg])


_STEPS = {
    **dict.fromkeys(("PROTO", "FRAME", "STOP"), _Depths.nothing),
    "MARK": _Depths.mark,
    "POP": _Depths.pop,
    "POP_MARK": _Depths.pop_mark,
    "DUP": _Depths.dup,
    **dict.fromkeys(("EMPTY_LIST", "EMPTY_TUPLE", "EMPTY_DICT", "EMPTY_SET"), _Depths.empty),
    "APPEND": _Depths.append,
    "SETITEM": _Depths.setitem,
    **dict.fromkeys(("APPENDS", "SETITEMS", "ADDITEMS"), _Depths.add_marked),
    **dict.fromkeys(("LIST", "TUPLE", "DICT", "FROZENSET"), _Depths.build_marked),
    **dict.fromkeys(("TUPLE1", "TUPLE2", "TUPLE3"), _Depths.tuple_n),
    "BINPERSID": _Depths.persistent_id,
    **dict.fromkeys(("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"), _Depths.put),
    **dict.fromkeys(("GET", "BINGET", "LONG_BINGET"), _Depths.get),
}  # any other safe opcode pushes a constant


class JudgeUnpickler(pickle.Unpickler):
    """The judge reads the learner's messages: plain containers only, the rest by id (after
    :func:`check_opcodes`: nothing is found by name at all)."""

    def __init__(self, data: bytes, resolve):
        super().__init__(io.BytesIO(data))
        self.resolve = resolve

    def find_class(self, module, name):
        raise ProtocolError(f"the learner's side sent {module}.{name} by name")

    def persistent_load(self, pid):
        if not isinstance(pid, tuple) or not pid or not isinstance(pid[0], str):
            raise ProtocolError("a malformed persistent id")
        return self.resolve(pid)


def loads(data: bytes, resolve, trusted: bool):
    reader = ChildUnpickler if trusted else JudgeUnpickler
    if not trusted:
        check_opcodes(data)
    try:
        return reader(data, resolve).load()
    except (ProtocolError, EOFError):
        raise
    except Exception as e:  # a malformed pickle: never the judge's fault
        raise ProtocolError(f"an unreadable message ({type(e).__name__}: {e})") from None


def named_from(pid: tuple):
    """A NamedTuple of kvlab's (a cached block) from its name and values."""
    try:
        _, module, qualname, values = pid
    except ValueError:
        raise ProtocolError("a malformed named tuple") from None
    cls = find_kvlab(module, qualname)
    fields = getattr(cls, "_fields", None)
    if not (issubclass(cls, tuple) and isinstance(fields, tuple)):
        raise ProtocolError(f"{qualname} is not a kvlab NamedTuple")
    if not isinstance(values, tuple) or len(values) != len(fields):
        raise ProtocolError(f"{qualname} with other fields")
    return cls._make(values)
