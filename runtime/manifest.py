"""Checkpoints you can trust: a digest of every file of a checkpoint step, checked before any of
its files is read, and a reader of DCP's pickled index that runs nothing.

``torch.distributed.checkpoint`` keeps a step's index in ``.metadata``, a pickle: loading a
planted one runs its payload. So a step counts only when it is intact:

* ``manifest.json`` (JSON, written last and atomically by rank 0, after every rank has hashed
  the shards it wrote) lists every file of the step with its size and SHA-256;
* every listed file is a regular file of that size and digest, and no other file is there (a
  planted ``__0.metadata`` or extra shard makes the step not intact);
* ``.metadata``, once its digest matched, is read by an unpickler that knows only the classes
  DCP writes for tensors (``ALLOWED``) and finds for every other global a refusal; its entries
  must all be tensors stored in files of the manifest (DCP loads non-tensor entries with
  ``torch.load(weights_only=False)``).

``verify`` says why a step is not intact (None when it is); ``checkpoint.find_intact`` takes the
newest intact step and names the ones it skipped. The load itself goes through ``safe_reader``,
which checks the digest of the very bytes it unpickles (no window between check and use), never
reads rank-local metadata and refuses byte entries. Shards hold tensors only, which DCP reads
with ``torch.load(weights_only=True)``.

No torch import here except inside ``safe_reader``: the checks serve the command line too.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import stat
from pathlib import Path
from typing import Any
from costmodel.units import MIB

MANIFEST = "manifest.json"
FORMAT = 1
DCP_INDEX = ".metadata"
MAX_MANIFEST_BYTES = 64 * MIB
_DIGEST_SIDECAR = ".digests-rank{rank}.json"

_META = "torch.distributed.checkpoint.metadata"
_DTYPES = ("float32", "float64", "float16", "bfloat16", "complex64", "complex128", "int8", "int16", "int32",
           "int64", "uint8", "uint16", "uint32", "uint64", "bool", "float8_e4m3fn", "float8_e5m2",
           "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
# every global a DCP index of tensors holds (torch 2.8-2.13), and nothing that can run code
ALLOWED = frozenset({(_META, n) for n in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                          "TensorStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")}
                    | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
                       ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
                       ("pathlib", "PurePosixPath"), ("collections", "OrderedDict")}
                    | {("torch", d) for d in _DTYPES})


class UnsafeCheckpoint(ValueError):
    """A checkpoint step that is not intact, or holds what a checkpoint of tensors never holds."""


# --------------------------------------------------------------------------------------
# Digests and the manifest
# --------------------------------------------------------------------------------------

def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(8 * MIB)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _entry(path: Path) -> dict[str, Any]:
    return {"bytes": os.lstat(path).st_size, "sha256": sha256_file(path)}


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_rank_digests(step_dir: str | os.PathLike, rank: int) -> None:
    """Every rank, after DCP's save: hash the shard files this rank wrote (``__<rank>_*``), so
    that rank 0 does not read the whole checkpoint again alone."""
    d = Path(step_dir)
    prefix = f"__{rank}_"
    mine = {p.name: _entry(p) for p in sorted(d.iterdir()) if p.name.startswith(prefix) and p.is_file()}
    _write_json_atomic(d / _DIGEST_SIDECAR.format(rank=rank), mine)


def write_manifest(step_dir: str | os.PathLike, step: int) -> dict:
    """Rank 0, after every rank's ``write_rank_digests`` and after ``meta.json``: the manifest of
    every file of the step, written last and atomically."""
    d = Path(step_dir)
    known: dict[str, dict] = {}
    sidecars = [p for p in d.iterdir() if p.name.startswith(".digests-rank") and p.name.endswith(".json")]
    for s in sidecars:
        known.update(json.loads(s.read_text()))
    files = {}
    for p in sorted(d.iterdir()):
        if p in sidecars or p.name in (MANIFEST, f".{MANIFEST}.tmp"):
            continue
        files[p.name] = known.get(p.name) or _entry(p)
    manifest = {"format": FORMAT, "step": step, "files": files}
    _write_json_atomic(d / MANIFEST, manifest)
    for s in sidecars:
        s.unlink()
    return manifest


def read_manifest(step_dir: str | os.PathLike) -> dict:
    p = Path(step_dir) / MANIFEST
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        raise UnsafeCheckpoint("no manifest (an interrupted save, or one written before manifests)") from None
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeCheckpoint(f"{MANIFEST} is not a regular file")
    if st.st_size > MAX_MANIFEST_BYTES:
        raise UnsafeCheckpoint(f"{MANIFEST} is {st.st_size} bytes (more than {MAX_MANIFEST_BYTES})")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise UnsafeCheckpoint(f"{MANIFEST} cannot be read ({e.strerror or e})") from None
    m = json_object(data, MANIFEST)
    files = m.get("files")
    if m.get("format") != FORMAT or not isinstance(files, dict) or not all(
            isinstance(n, str) and _plain(n) and isinstance(e, dict) and isinstance(e.get("sha256"), str)
            and type(e.get("bytes")) is int and e["bytes"] >= 0 for n, e in files.items()):
        raise UnsafeCheckpoint(f"{MANIFEST} is not a manifest of format {FORMAT}")
    return m


def json_object(data: bytes, what: str) -> dict:
    """A JSON object from a checkpoint's bytes, or ``UnsafeCheckpoint``: text that is not JSON, a
    document that is not an object (a list, a number), or one nested too deep to read (a list
    200,000 deep makes the parser recurse past Python's limit)."""
    try:
        obj = json.loads(data)
    except RecursionError:
        raise UnsafeCheckpoint(f"{what} is nested too deeply to be a checkpoint file") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UnsafeCheckpoint(f"{what} is not readable JSON ({str(e)[:120]})") from None
    if not isinstance(obj, dict):
        raise UnsafeCheckpoint(f"{what} holds a JSON {type(obj).__name__}, not an object")
    return obj


def _plain(name: str) -> bool:
    return bool(name) and "/" not in name and "\\" not in name and name not in (".", "..") and "\0" not in name


def verify(step_dir: str | os.PathLike, digests: bool = True) -> str | None:
    """Why the step at ``step_dir`` is not intact, or None when it is (see the module docstring).
    Reads every file once; unpickles nothing but ``.metadata`` and that with inert stand-ins.
    ``digests=False`` (a step its launcher verified) checks the digest of ``.metadata`` only."""
    d = Path(step_dir)
    try:
        files = read_manifest(d)["files"]
        present = {p.name for p in d.iterdir()} - {MANIFEST}
        extra = sorted(present - set(files))
        if extra:
            return f"files not in its manifest: {', '.join(extra[:5])}"
        missing = sorted(set(files) - present)
        if missing:
            return f"files of its manifest missing: {', '.join(missing[:5])}"
        if DCP_INDEX not in files:
            return f"its manifest lists no {DCP_INDEX}"
        for name in sorted(files, key=lambda n: (n != DCP_INDEX, n)):
            if not digests and name != DCP_INDEX:
                continue
            p = d / name
            st = os.lstat(p)
            if not stat.S_ISREG(st.st_mode):
                return f"{name} is not a regular file"
            if st.st_size != files[name]["bytes"]:
                return f"{name} is {st.st_size} bytes, its manifest says {files[name]['bytes']}"
            if sha256_file(p) != files[name]["sha256"]:
                return f"{name} does not match its digest in the manifest (changed or corrupted)"
        check_index(scan_index((d / DCP_INDEX).read_bytes()), set(files))
    except UnsafeCheckpoint as e:
        return str(e)
    except OSError as e:
        return f"cannot read it: {e.strerror or e}"
    return None


# --------------------------------------------------------------------------------------
# DCP's index: unpickled with an allowlist
# --------------------------------------------------------------------------------------

class _Inert:
    """What the scan builds for an allowed class: it records its arguments and state, runs nothing."""
    _qualname = ""

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        obj.__dict__["_args"] = args
        return obj

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        self.__dict__["_state"] = state


_INERT: dict[tuple[str, str], type] = {}


def _refuse(module: str, name: str) -> UnsafeCheckpoint:
    return UnsafeCheckpoint(f"{DCP_INDEX} refers to {module}.{name}, which a checkpoint of tensors never holds "
                            "(a planted pickle?); not loaded")


class _ScanUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in ALLOWED:
            raise _refuse(module, name)
        key = (module, name)
        if key not in _INERT:
            _INERT[key] = type(name, (_Inert,), {"_qualname": f"{module}.{name}"})
        return _INERT[key]

    def persistent_load(self, pid):
        raise UnsafeCheckpoint(f"{DCP_INDEX} holds a persistent reference; not loaded")


def _fields(obj: Any) -> dict:
    """The attributes an inert stand-in received (``__dict__`` state, or slots state)."""
    state = obj.__dict__.get("_state") if isinstance(obj, _Inert) else None
    if isinstance(state, tuple) and len(state) == 2:
        merged = dict(state[0] or {})
        merged.update(state[1] or {})
        return merged
    return state if isinstance(state, dict) else {}


def _kind(obj: Any) -> str:
    return type(obj)._qualname if isinstance(obj, _Inert) else type(obj).__name__


def scan_index(data: bytes) -> Any:
    """``.metadata`` as inert stand-ins; ``UnsafeCheckpoint`` at the first global not allowed."""
    try:
        return _ScanUnpickler(io.BytesIO(data)).load()
    except UnsafeCheckpoint:
        raise
    except Exception as e:   # a truncated or malformed pickle
        raise UnsafeCheckpoint(f"{DCP_INDEX} is not a readable index ({type(e).__name__}: {e})") from None


def check_index(md: Any, files: set[str]) -> None:
    """Entries must be tensors, stored in files the manifest lists (scan or real objects)."""
    if isinstance(md, _Inert):
        if _kind(md) != f"{_META}.Metadata":
            raise UnsafeCheckpoint(f"{DCP_INDEX} holds a {_kind(md)}, not DCP Metadata")
        f = _fields(md)
        entries, storage = f.get("state_dict_metadata"), f.get("storage_data")
        infos = (_fields(v) for v in (storage or {}).values())
    else:
        entries, storage = getattr(md, "state_dict_metadata", None), getattr(md, "storage_data", None)
        infos = ({"relative_path": getattr(v, "relative_path", None)} for v in (storage or {}).values())
    if not isinstance(entries, dict) or not isinstance(storage, dict):
        raise UnsafeCheckpoint(f"{DCP_INDEX} has no tensor entries")
    bad = sorted(str(k) for k, v in entries.items() if _kind(v) not in (f"{_META}.TensorStorageMetadata",
                                                                           "TensorStorageMetadata"))
    if bad:
        raise UnsafeCheckpoint(f"{DCP_INDEX} holds non-tensor entries ({', '.join(bad[:3])}); a checkpoint of this "
                               "runtime holds tensors only")
    for info in infos:
        rel = info.get("relative_path")
        if not isinstance(rel, str) or not _plain(rel) or rel not in files:
            raise UnsafeCheckpoint(f"{DCP_INDEX} points at {rel!r}, not a file of the manifest")


def safe_reader(step_dir: str | os.PathLike):
    """A DCP ``FileSystemReader`` for an intact step that checks what it reads (module docstring)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.distributed.checkpoint.planner import LoadItemType

    d = Path(step_dir)
    manifest = read_manifest(d)

    class _Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str):
            if (module, name) not in ALLOWED:
                raise _refuse(module, name)
            return super().find_class(module, name)

        def persistent_load(self, pid):
            raise UnsafeCheckpoint(f"{DCP_INDEX} holds a persistent reference; not loaded")

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            if kwargs.get("rank") is not None:
                raise UnsafeCheckpoint("rank-local metadata is never read")
            data = (d / DCP_INDEX).read_bytes()
            want = manifest["files"].get(DCP_INDEX, {}).get("sha256")
            if hashlib.sha256(data).hexdigest() != want:
                raise UnsafeCheckpoint(f"{d / DCP_INDEX} does not match its digest in the manifest; not loaded")
            md = _Unpickler(io.BytesIO(data)).load()
            check_index(md, set(manifest["files"]))
            if getattr(md, "storage_meta", None) is None:
                md.storage_meta = StorageMeta()
            md.storage_meta.load_id = self.load_id
            return md

        def read_data(self, plan, planner):
            if any(item.type == LoadItemType.BYTE_IO for item in plan.items):
                raise UnsafeCheckpoint("the load plan asks for non-tensor entries; not loaded")
            return super().read_data(plan, planner)

    return SafeReader(str(d))


__all__ = ["MANIFEST", "UnsafeCheckpoint", "verify", "write_rank_digests", "write_manifest", "read_manifest",
           "scan_index", "check_index", "safe_reader", "sha256_file", "ALLOWED"]
