"""One encoder per kind of text the emitters write: every value that came from a file (a model,
cluster or node-group name, a path, a number, a site flag) reaches generated text only through one of
these functions, so that no value can end a string, a comment or a line and become code.

* a shell word: ``sh`` (``Raw`` for the emitter's own ``"$VAR"`` text): one word, nothing expanded;
* a comment or one-line label (shell, Python, YAML): ``one_line``: no line break, no control or
  format character;
* a Python value: ``py_literal`` (``PyCode`` for the emitter's own code): a literal that
  ``ast.literal_eval`` reads back as the same value;
* a Python docstring: ``py_docstring``: one string literal whatever the text holds (``\"\"\"`` too);
* YAML: ``yaml_scalar`` (a quoted scalar that reads back as the same string), ``yaml_document``
  (``yaml.safe_dump`` for a whole document);
* JSON: ``json_text`` (``json.dumps`` refusing NaN and infinity, which are not JSON);
* TOML: ``toml_value``; HTML: ``html_text`` (``& < > " '`` escaped);
* an ``#SBATCH`` option: ``sbatch_option``: one option on one line, from a short safe alphabet.

A value an encoder cannot write faithfully (a NaN in JSON, a character sbatch cannot carry, an
object that has no literal form) raises ``EncodeError`` naming the field, the value and what is
allowed: the emitter never writes something that reads back as another value. ``planner emit``
maps ``EncodeError`` to exit code 2 (the plan's value is bad input).

This module imports only the input-error type (``costmodel.specs.SpecError``, exit 2):
``emitters.base`` re-exports the shell and comment helpers, and the command line may use ``html_text``.
"""
from __future__ import annotations

import html
import json
import math
import re
import shlex
import unicodedata
from typing import Any, Iterable

import yaml

from costmodel.specs import SpecError

# Unicode categories that must never appear raw in generated text: controls (a newline, a carriage
# return, NEL), format characters (bidi overrides), line and paragraph separators, surrogates,
# private use and unassigned code points.
_INVISIBLE = ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")


class EncodeError(SpecError):
    """A value that an encoder cannot write faithfully. The message names the field, the value,
    the limit and a hint; ``planner emit`` maps it to exit code 2."""


def _invisible(c: str) -> bool:
    return unicodedata.category(c) in _INVISIBLE


def _show(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# --------------------------------------------------------------------------------------
# Shell
# --------------------------------------------------------------------------------------

class Raw(str):
    """Shell text written as is (a ``"$VAR"`` reference), not quoted. Never built from a file's value."""


def sh(value: object) -> str:
    """``value`` as one shell word: nothing in it is expanded or split (``true``/``false`` for a bool)."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return shlex.quote(str(value))


def one_line(text: object) -> str:
    """``text`` on one line: control, format and line/paragraph-separator characters (a newline,
    a carriage return, U+2028...) are written as escapes (``\\n``), so that a name from a file
    cannot end a comment line and start a command."""
    out = []
    for c in str(text):
        if _invisible(c):
            out.append(c.encode("unicode_escape", "backslashreplace").decode("ascii"))
        else:
            out.append(c)
    return "".join(out)


# --------------------------------------------------------------------------------------
# Python
# --------------------------------------------------------------------------------------

class PyCode(str):
    """Python source written as is (a constructor call the emitter itself composes). Never built
    from a file's value: values inside it go through ``py_literal``."""


def py_literal(value: Any, field: str = "value") -> str:
    """``value`` as a Python literal that ``ast.literal_eval`` reads back as an equal value.

    Accepts None, bool, int, finite float, str and (nested) list, tuple and dict of them;
    ``PyCode`` is written as is. Anything else (a non-finite float, whose ``repr`` is a name, or an
    object whose ``repr`` is code) raises ``EncodeError``.
    """
    if isinstance(value, PyCode):
        return str(value)
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise EncodeError(f"{field} = {value!r} cannot be written into generated Python: only finite "
                              "numbers are literals; fix the value in the plan or its model/cluster file")
        return repr(float(value))
    if isinstance(value, str):
        return repr(str(value))
    if isinstance(value, list):
        return "[" + ", ".join(py_literal(v, field) for v in value) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(py_literal(v, field) for v in value)
        return "(" + inner + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{py_literal(k, field)}: {py_literal(v, field)}" for k, v in value.items()) + "}"
    raise EncodeError(f"{field} = {_show(value)} ({type(value).__name__}) has no Python literal form; "
                      "only None, bool, int, finite float, str, list, tuple and dict are written")


def py_docstring(text: str) -> str:
    """``text`` as a triple-quoted Python string literal (a module or function docstring).

    Line breaks stay line breaks; a backslash, every double quote and every other invisible
    character are escaped, so no text can close the literal: ``ast.literal_eval`` of the result
    is ``text``.
    """
    out = []
    for c in str(text):
        if c == "\n":
            out.append(c)
        elif c == "\\":
            out.append("\\\\")
        elif c == '"':
            out.append('\\"')
        elif _invisible(c):
            out.append(c.encode("unicode_escape", "backslashreplace").decode("ascii"))
        else:
            out.append(c)
    return '"""' + "".join(out) + '"""'


def py_comment(text: object) -> str:
    """One ``# ...`` line per line of ``text`` (each made one line: nothing can end the comment)."""
    return "".join(f"# {one_line(line)}".rstrip() + "\n" for line in str(text).split("\n"))


# --------------------------------------------------------------------------------------
# YAML, JSON, TOML, HTML
# --------------------------------------------------------------------------------------

_YAML_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0"}


def yaml_scalar(value: object) -> str:
    """A string as a quoted YAML scalar: it reads back as the same string (never as a number, a
    bool, a key or a second document). Single-quoted (``'`` doubled) when every character is
    visible; else double-quoted, with line breaks and invisible characters written as escapes."""
    text = str(value)
    if not any(_invisible(c) for c in text):
        return "'" + text.replace("'", "''") + "'"
    out = ['"']
    for c in text:
        if c in _YAML_ESCAPES:
            out.append(_YAML_ESCAPES[c])
        elif _invisible(c) or c in "\x85\u2028\u2029\ufeff":
            code = ord(c)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000
                       else f"\\U{code:08x}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def yaml_document(obj: Any) -> str:
    """A whole YAML document from plain data (``yaml.safe_dump``: it quotes what needs quoting)."""
    return yaml.safe_dump(obj, sort_keys=True, default_flow_style=False)


def json_text(obj: Any, indent: int | None = 2) -> str:
    """JSON text (ending in a newline): NaN and infinity, which are not JSON, raise ``EncodeError``."""
    try:
        return json.dumps(obj, indent=indent, allow_nan=False) + "\n"
    except ValueError as e:
        raise EncodeError(f"a value cannot be written as JSON ({e}); NaN and infinity are not JSON numbers: "
                          "fix the plan's value") from None


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        if isinstance(v, float) and not math.isfinite(v):
            raise EncodeError(f"{v!r} cannot be written as a TOML number here; fix the plan's value")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)     # a TOML basic string: the same escapes as JSON
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise EncodeError(f"no TOML form for {_show(v)} ({type(v).__name__})")


def html_text(value: object) -> str:
    """Text (or an attribute value) for HTML: ``& < > " '`` escaped."""
    return html.escape(str(value), quote=True)


# --------------------------------------------------------------------------------------
# Slurm #SBATCH options
# --------------------------------------------------------------------------------------

# sbatch reads ``#SBATCH`` lines with its own word splitting (no shell quoting): a value with a
# space, a quote or a line break would end the option or the line, and the next line is shell.
# Account, partition, QOS, reservation, time and similar site values use letters, digits and a
# few separators: ``job-name``, ``gpu:8``, ``1-00:00:00``, ``a100,h100``, ``%x-%j.out``, ``node[1-4]``.
SBATCH_VALUE = re.compile(r"[A-Za-z0-9_.:,@%+=/\[\]-]{1,256}")
_SBATCH_FLAG = re.compile(r"[a-z][a-z0-9-]{0,40}")


def sbatch_option(flag: str, value: object | None = None, field: str = "") -> str:
    """One ``#SBATCH --flag[=value]`` line (ending in a newline).

    ``value`` must be 1-256 characters of ``[A-Za-z0-9_.:,@%+=/[]-]`` (what Slurm's own accounts,
    partitions, times and GRES strings use); anything else raises ``EncodeError`` naming ``field``.
    """
    if not _SBATCH_FLAG.fullmatch(flag):
        raise EncodeError(f"sbatch option name {flag!r} is not an option name (lower-case letters, digits, '-')")
    if value is None:
        return f"#SBATCH --{flag}\n"
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise EncodeError(f"{field or '--' + flag} = {_show(value)} is not a string or an integer")
    text = str(value)
    if not SBATCH_VALUE.fullmatch(text):
        bad = sorted({c for c in text if not SBATCH_VALUE.fullmatch(c)})[:5]
        why = ("is empty" if not text else "is longer than 256 characters" if len(text) > 256
               else f"holds {', '.join(repr(c) for c in bad)}")
        raise EncodeError(f"{field or '--' + flag} = {_show(text)} {why}; an #SBATCH value may hold only "
                          "letters, digits and _ . : , @ % + = / [ ] - (1-256 characters); use the name your "
                          "site's `sacctmgr`/`sinfo` shows")
    return f"#SBATCH --{flag}={text}\n"


def sbatch_block(options: Iterable[tuple[str, object | None]]) -> str:
    return "".join(sbatch_option(f, v) for f, v in options)
