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

import collections
import dataclasses
import enum
import io
import os
import pickle
import struct
import sys

HEADER = struct.Struct("!Q")
MAX_MESSAGE = 1 << 29  # 512 MiB: a bigger message is a broken or hostile peer
# exact types pickled as they are (their subclasses, a learner's own, go by handle)
PLAIN = (type(None), bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)
PLAIN_TYPES = frozenset(PLAIN) | {collections.deque, collections.OrderedDict, bytearray, range}
# what JudgeUnpickler may find by name: containers rebuilt from plain data only
JUDGE_GLOBALS = {
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "complex"),
    ("builtins", "bytearray"),
    ("builtins", "range"),
    ("builtins", "slice"),
    ("collections", "deque"),
    ("collections", "OrderedDict"),
}


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
    """The tensor's whole storage, as bytes (on the CPU)."""
    storage = tensor.untyped_storage()
    return bytes(storage.cpu()) if storage.device.type != "cpu" else bytes(storage)


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


def build_storages(table: dict) -> dict:
    """Storages from ``{key: (nbytes, device, bytes)}``, each a uint8 tensor over its bytes."""
    import torch

    built = {}
    for key, (device, raw) in table.items():
        if not isinstance(raw, bytes) or not isinstance(device, str):
            raise ProtocolError("a storage is not bytes")
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0)
        built[key] = flat.to(device) if device != "cpu" else flat
    return built


def tensor_from(pid: tuple, built: dict):
    """The tensor a ``tensor_id`` names, a view of its storage as rebuilt."""
    import torch

    _, key, dtype, size, stride, offset, _device = pid
    if key not in built:
        raise ProtocolError("a tensor without its storage")
    dtype = getattr(torch, dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ProtocolError("a tensor of an unknown dtype")
    base = built[key]
    typed = (
        base.view(dtype)
        if base.numel() % torch.empty((), dtype=dtype).element_size() == 0
        else None
    )
    if typed is None:
        raise ProtocolError("a storage that does not hold whole elements")
    return typed.as_strided(tuple(size), tuple(stride), int(offset))


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


class JudgeUnpickler(pickle.Unpickler):
    """The judge reads the learner's messages: plain containers only, the rest by id."""

    def __init__(self, data: bytes, resolve):
        super().__init__(io.BytesIO(data))
        self.resolve = resolve

    def find_class(self, module, name):
        if (module, name) in JUDGE_GLOBALS:
            return super().find_class(module, name)
        raise ProtocolError(f"the learner's side sent {module}.{name} by name")

    def persistent_load(self, pid):
        if not isinstance(pid, tuple) or not pid or not isinstance(pid[0], str):
            raise ProtocolError("a malformed persistent id")
        return self.resolve(pid)


def loads(data: bytes, resolve, trusted: bool):
    reader = ChildUnpickler if trusted else JudgeUnpickler
    try:
        return reader(data, resolve).load()
    except (ProtocolError, EOFError):
        raise
    except Exception as e:  # a malformed pickle: never the judge's fault
        raise ProtocolError(f"an unreadable message ({type(e).__name__}: {e})") from None
