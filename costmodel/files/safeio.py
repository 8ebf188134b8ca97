"""Output files that cannot hurt: every file the tools write for a user goes through here.

Rules, for a file (``write_text``, ``write_bytes``):

* only a regular file (or nothing) may be at the path: a symbolic link, a FIFO, a character or
  block device, a socket or a folder there is refused with ``OutputError`` (exit 2), never
  written through or replaced;
* atomically: the bytes go to a temporary file in the same folder, are flushed to disk, and
  ``os.replace`` puts them in place, so a reader (or a ``kill -9``) sees the old file or the
  whole new one;
* with the user's umask (``0666 & ~umask``; scripts ``0777 & ~umask``), or the mode of the file
  being replaced: a temporary file's 0600 never leaks into the result.

For a folder (``write_folder``): the new files are written into a temporary folder next to the
target; the files of an existing target that are not being replaced are hard-linked into it
(copied where links cannot be made), and the two folders are then swapped in one step
(``renameat2(RENAME_EXCHANGE)`` on Linux; elsewhere two renames, with a moment in which the
target is missing). A ``kill -9`` at any point leaves the old folder or the new one, never a mix
(a leftover ``.NAME.tmp-*`` folder beside it holds the other). When this process's working
folder is inside the target, the swap would strand it, so each file is replaced atomically on
its own instead.

``check_output`` is the same refusal, for a command to call before it does any work.

This is the lowest layer that writes user outputs (``profiles`` writes cluster files and
reports), so ``planner`` uses it too; it imports nothing of ours.
"""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Mapping

# for tests only: seconds to sleep after each file a folder write puts in its temporary folder,
# so a test can kill the writer half-way
_PAUSE_ENV = "PLANNER_TEST_WRITE_PAUSE_S"


class OutputError(ValueError):
    """An output path that must not be written (not a regular file), or a write that failed.
    The command line maps it to exit code 2."""


_KINDS = [(stat.S_ISLNK, "symbolic link"), (stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO (named pipe)"),
          (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")]


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "special file"


def umask() -> int:
    """This process's umask, read without changing it where Linux allows."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)   # no /proc: the classic read-and-restore
    os.umask(old)
    return old


def default_mode(executable: bool = False) -> int:
    return (0o777 if executable else 0o666) & ~umask()


def _lstat(p: Path, what: str) -> os.stat_result | None:
    """What is at ``p`` (not following a link), or None when nothing is (the writer says why it
    cannot write there)."""
    try:
        return os.lstat(p)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise OutputError(f"{what} {p}: cannot inspect it: {e.strerror}") from None


def check_output(path: str | os.PathLike, what: str = "output") -> Path:
    """``path`` if it is a regular file or absent; else ``OutputError`` saying what is there."""
    p = Path(path)
    st = _lstat(p, what)
    if st is None:
        return p
    if stat.S_ISREG(st.st_mode):
        return p
    kind = _kind(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        detail = f"a symbolic link to {os.readlink(p)}; give the real path, or remove the link"
    elif stat.S_ISDIR(st.st_mode):
        detail = "a folder; give a file path"
    else:
        detail = f"a {kind}, not a regular file; refusing to write over it; give a file path"
    raise OutputError(f"{what} {p} is {detail}")


def check_output_folder(path: str | os.PathLike, what: str = "output folder") -> Path:
    """``path`` if it is a real folder or absent; a symbolic link or a file there is refused."""
    p = Path(path)
    st = _lstat(p, what)
    if st is None:
        return p
    if stat.S_ISDIR(st.st_mode):
        return p
    if stat.S_ISLNK(st.st_mode):
        raise OutputError(f"{what} {p} is a symbolic link to {os.readlink(p)}; give the real folder, "
                          "or remove the link")
    raise OutputError(f"{what} {p} is a {_kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'file'}, "
                      "not a folder; give a folder path")


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_bytes(path: str | os.PathLike, data: bytes, what: str = "output", executable: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically (see the module docstring). Returns the path."""
    p = check_output(path, what)
    try:
        keep = stat.S_IMODE(os.stat(p).st_mode)      # replacing a file keeps its permissions
    except (FileNotFoundError, NotADirectoryError):
        keep = None
    mode = keep if keep is not None else default_mode(executable)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    except OSError as e:
        raise OutputError(f"cannot write {what} {p}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode)
        check_output(p, what)                        # nothing slipped in meanwhile
        os.replace(tmp, p)
    except OSError as e:
        _unlink(tmp)
        raise OutputError(f"cannot write {what} {p}: {e.strerror}") from None
    except BaseException:
        _unlink(tmp)
        raise
    _fsync_dir(p.parent)
    return p


def write_text(path: str | os.PathLike, text: str, what: str = "output", executable: bool = False) -> Path:
    return write_bytes(path, text.encode("utf-8"), what, executable)


def check_append(path: str | os.PathLike, what: str = "output") -> Path:
    """For a log a command appends to: the same refusal as ``check_output``."""
    return check_output(path, what)


def _unlink(p: str | os.PathLike) -> None:
    try:
        os.unlink(p)
    except OSError:
        pass


# --------------------------------------------------------------------------------------
# Folders
# --------------------------------------------------------------------------------------

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2). False when the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _link_tree(src: Path, dst: Path) -> None:
    """``dst`` becomes a copy of folder ``src`` made of hard links (copies where links fail);
    symbolic links are recreated as links."""
    def link(s: str, d: str) -> None:
        try:
            os.link(s, d, follow_symlinks=False)
        except OSError:
            shutil.copy2(s, d, follow_symlinks=False)
    shutil.copytree(src, dst, symlinks=True, copy_function=link, dirs_exist_ok=True)


def _inside(child: Path, parent: Path) -> bool:
    try:
        child.relative_to(parent)
        return True
    except ValueError:
        return False


def write_folder(out: str | os.PathLike, files: Mapping[str, str | bytes], executable: set[str] | None = None,
                 what: str = "output folder") -> Path:
    """Put ``files`` (name -> text or bytes) into folder ``out`` in one step, keeping the other
    files already there (see the module docstring). The names are plain file names."""
    out = check_output_folder(out, what)
    executable = executable or set()
    for name in files:
        if not name or "/" in name or os.sep in name or name in (".", ".."):
            raise ValueError(f"not a plain file name: {name!r}")
        check_output(out / name, "output file")      # no link, FIFO or device among the targets
    exists = out.exists()
    real = Path(os.path.realpath(out))
    pause = float(os.environ.get(_PAUSE_ENV, "0") or 0)
    if exists and _inside(Path.cwd().resolve(), real):
        # swapping the folder would leave this process (and the shell it came from) in the old one
        for name, data in files.items():
            write_bytes(out / name, data.encode("utf-8") if isinstance(data, str) else data, "output file",
                        executable=name in executable)
            if pause:
                time.sleep(pause)
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    except OSError as e:
        raise OutputError(f"cannot write {what} {out}: {e.strerror}") from None
    try:
        if exists:
            for entry in os.scandir(out):
                if entry.name in files:
                    continue
                src, dst = Path(entry.path), stage / entry.name
                if entry.is_dir(follow_symlinks=False):
                    _link_tree(src, dst)
                elif entry.is_symlink():
                    os.symlink(os.readlink(src), dst)
                else:
                    try:
                        os.link(src, dst, follow_symlinks=False)
                    except OSError:
                        shutil.copy2(src, dst, follow_symlinks=False)
        for name, data in files.items():
            raw = data.encode("utf-8") if isinstance(data, str) else data
            fd = os.open(stage / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(raw)
                f.flush()
                os.fsync(f.fileno())
                os.fchmod(f.fileno(), default_mode(name in executable))
            if pause:
                time.sleep(pause)
        os.chmod(stage, stat.S_IMODE(os.stat(out).st_mode) if exists else default_mode(executable=True))
        _fsync_dir(stage)
        if not exists:
            os.rename(stage, out)                # fails if something appeared there meanwhile
        elif _exchange(stage, out):
            pass                                 # stage now holds the old folder
        else:
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
            os.rename(out, old / "x")
            os.rename(stage, out)
            shutil.rmtree(old, ignore_errors=True)
            stage = old
        _fsync_dir(out.parent)
    except OSError as e:
        shutil.rmtree(stage, ignore_errors=True)
        raise OutputError(f"cannot write {what} {out}: {e.strerror or e}") from None
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    shutil.rmtree(stage, ignore_errors=True)     # the old folder
    return out


__all__ = ["OutputError", "check_output", "check_output_folder", "check_append", "write_text", "write_bytes",
           "write_folder", "umask", "default_mode"]
