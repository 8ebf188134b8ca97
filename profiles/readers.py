"""Reading the files people hand the planner (model, cluster, plan, measured-run and NVML
recording files), within bounds, before any of their content is used.

* the path is a regular file (a FIFO or a device would block or never end), at most
  ``MAX_FILE_BYTES`` long, and UTF-8 text (a byte-order mark is allowed);
* YAML is parsed with the safe loader; the parsed document is then walked once, counting every
  node as often as aliases make a consumer see it, and refused past ``MAX_NODES`` (a "billion
  laughs" alias bomb is a few hundred bytes that expand to 10^9 nodes when printed or copied)
  or past ``MAX_DEPTH`` levels;
* JSON refuses ``NaN`` and ``Infinity`` (not JSON, though Python's parser takes them); YAML's
  ``.nan`` and ``.inf`` are refused by the same walk, with the path of the value;
* every mapping key is a string (a ``1: x`` key would break the unknown-key messages), and no key
  appears twice in one mapping (YAML and JSON parsers keep the last silently: a file whose two
  ``layers:`` disagree means one of them is a mistake).

Errors are ``SpecError`` with the file and, inside it, the path of the bad node.
"""
from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from costmodel.specs import SpecError
from costmodel.units import MIB

MAX_FILE_BYTES = 1024 * 1024        # 64x the largest real input (a 2,048-GPU MoE plan: 16 KB); parses in ~3 s
MAX_NODES = 200_000                # scalars, lists and mappings, counted through aliases
MAX_DEPTH = 64                      # nesting levels (real files: under 8)


def read_text(path: str | os.PathLike, what: str) -> str:
    """The text of ``path``, or SpecError saying why not (``what``: "model file", "plan file", ...)."""
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise SpecError(f"cannot read {what} {p}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise SpecError(f"{what} {p} is a folder; give the file inside it")
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(f"{what} {p} is not a regular file (a pipe or a device?); give a file")
    if st.st_size > MAX_FILE_BYTES:
        raise SpecError(f"{what} {p} is {st.st_size / MIB:.1f} MiB, more than the {MAX_FILE_BYTES // MIB} MiB "
                        "an input file may be; is it the right file?")
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise SpecError(f"cannot read {what} {p}: {e.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise SpecError(f"{what} {p} is more than the {MAX_FILE_BYTES // MIB} MiB an input file may be")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SpecError(f"{what} {p} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                        "save it as UTF-8") from None


def _path(at: tuple | None) -> str:
    """``at`` is a linked path ``(parent, key)``; the dotted form of it."""
    parts: list[Any] = []
    while at is not None:
        at, k = at
        parts.append(k)
    out = ""
    for x in reversed(parts):
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else str(x))
    return out or "the top level"


def check_tree(data: Any, where: str) -> Any:
    """Walk a parsed document once: node count (through aliases), depth, finite floats, string
    keys. Returns ``data``; raises SpecError naming the first problem and its path."""
    count = 0
    stack: list[tuple[Any, int, tuple | None]] = [(data, 0, None)]
    while stack:
        node, depth, at = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise SpecError(f"{where}: more than {MAX_NODES:,} values (a YAML alias bomb, or a reference cycle?); "
                            "refused before reading further")
        if depth > MAX_DEPTH:
            raise SpecError(f"{where}: nested more than {MAX_DEPTH} levels deep, at {_path(at)[:80]}")
        if isinstance(node, float):
            if not math.isfinite(node):
                raise SpecError(f"{where}: {_path(at)} is {node}; give a finite number")
        elif isinstance(node, dict):
            for k, v in node.items():
                if not isinstance(k, str):
                    raise SpecError(f"{where}: key {k!r} at {_path(at)} is not a string; quote it")
                stack.append((v, depth + 1, (at, k)))
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                stack.append((v, depth + 1, (at, i)))
    return data


class _UniqueKeyLoader(yaml.SafeLoader):
    """The safe loader, refusing a key given twice in one mapping."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.setdefault(key, key_node.start_mark)
        except TypeError:              # an unhashable key: the safe loader's own error follows
            break
        if first is not key_node.start_mark:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {str(key)[:60]!r} appears twice in one mapping (lines {first.line + 1} and "
                f"{key_node.start_mark.line + 1}); keep one", key_node.start_mark)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k[:60]!r} appears twice in one object; keep one")
        out[k] = v
    return out


def parse_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load`` (refusing a key given twice) with the checks of ``check_tree``."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        mark = getattr(e, "problem_mark", None)
        if isinstance(e, yaml.constructor.ConstructorError) and "appears twice" in str(e.problem):
            raise SpecError(f"{where}: {e.problem}") from None
        raise SpecError(f"{where}: not valid YAML ({first}" + (f", line {mark.line + 1}" if mark else "") + ")") from None
    except RecursionError:
        raise SpecError(f"{where}: nested too deeply to read") from None
    return check_tree(data, where)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str, where: str) -> Any:
    """``json.loads`` refusing NaN and Infinity, with the checks of ``check_tree``."""
    try:
        data = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_json_pairs)
    except json.JSONDecodeError as e:
        # some messages end in "at" ("Unterminated string starting at"): no second one
        at = " " if e.msg.endswith(" at") else " at "
        raise SpecError(f"{where}: not valid JSON ({e.msg}{at}line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise SpecError(f"{where}: nested too deeply to read") from None
    except ValueError as e:              # NaN/Infinity, or an integer of more than 4300 digits
        raise SpecError(f"{where}: not valid JSON ({str(e).splitlines()[0]})") from None
    return check_tree(data, where)


def load_yaml(path: str | os.PathLike, what: str) -> Any:
    """A YAML file, read and checked (see the module docstring)."""
    return parse_yaml(read_text(path, what), str(path))


def load_json(path: str | os.PathLike, what: str) -> Any:
    """A JSON file, read and checked (see the module docstring)."""
    return parse_json(read_text(path, what), str(path))
