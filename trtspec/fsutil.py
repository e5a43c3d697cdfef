"""Atomic file and directory writes: an interrupted run never leaves a half-written output.

`write_error` turns an OSError into the one-line error the CLI prints (the path, the reason, what
to do); `writing` applies it to a block; `refuse_overwrite` is the rule for single-file outputs.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trtspec.errors import TrtspecError, UsageError, shorten

_REASONS = {
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOTDIR: "not a directory (or a parent of it is not)",
    errno.EISDIR: "is a directory",
    errno.ENAMETOOLONG: "file name too long",
    errno.EEXIST: "already exists",
}


def _reason(exc: OSError) -> str:
    return shorten(_REASONS.get(exc.errno or 0) or exc.strerror or str(exc))


def write_error(exc: OSError, where: str | Path, atomic: bool = True) -> TrtspecError:
    """One line naming `where` and why it cannot be written: exit 1 for a full disk, 2 otherwise.
    `atomic`: the write was staged and renamed, so it can say that nothing was left half-written."""
    where = shorten(where)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        full = "no space left on the device" if exc.errno == errno.ENOSPC else "disk quota exceeded"
        kept = "; nothing was left half-written" if atomic else ""
        return TrtspecError(f"{full} while writing {where}{kept}: free space and re-run")
    return UsageError(f"cannot write {where}: {_reason(exc)}")


def path_error(exc: OSError) -> TrtspecError | None:
    """The CLI's last resort for an OSError about a file that no stage worded itself: the file and
    the reason on one line (None when the error names no file, which stays a bug's traceback)."""
    if exc.filename is None:
        return None
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return write_error(exc, exc.filename, atomic=False)  # whoever wrote it did not say how
    return UsageError(f"{shorten(exc.filename)}: {_reason(exc)}")


@contextmanager
def writing(where: str | Path) -> Iterator[None]:
    """Turn an OSError raised in the block into `write_error(exc, where)`."""
    try:
        yield
    except OSError as exc:
        raise write_error(exc, where) from None


def refuse_overwrite(path: Path, force: bool) -> None:
    """A single-file output may replace a regular file only with --force, and never anything else
    (a device such as /dev/null, a directory, a fifo): those would be replaced by a regular file."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise write_error(exc, path) from None
    if not stat.S_ISREG(mode):
        kind = "is a directory" if stat.S_ISDIR(mode) else "is not a regular file (a device, fifo or socket)"
        raise UsageError(f"{shorten(path)}: {kind}; name a regular file to write")
    if not force:
        raise UsageError(f"{shorten(path)}: already exists (use --force to overwrite)")


def current_umask() -> int:
    """The process's umask, read where Linux shows it: os.umask can only read it by setting it, which for a
    moment gives files other threads create mode 0666."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def readable_by_others(path: str | Path) -> None:
    """Give a file (a folder) the mode a plain open() (mkdir) would, 0666 (0777) less the umask: outputs are
    meant to be read by others, such as a container's user, and mkstemp, mkdtemp or safetensors make theirs
    private."""
    os.chmod(path, (0o777 if Path(path).is_dir() else 0o666) & ~current_umask())


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write to a temporary file beside `path`, fsync, then rename over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        readable_by_others(tmp)  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@contextmanager
def staging_for(final: Path) -> Iterator[Path]:
    """A folder of this process's own beside `final` to write into before replace_dir moves it into place:
    named by mkdtemp (pid-named ones were shared with a leftover of a reused pid, a container's 1, and
    deleted), readable as any output, and removed whatever happens."""
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{final.name}-", dir=final.parent))
    try:
        readable_by_others(staging)
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def replace_dir(staging: Path, final: Path, keep: tuple[str, ...] = ()) -> None:
    """Move a finished staging directory into place, replacing an older one; the older one's entries named in
    `keep` (what other tools wrote into it) move into the new one, and stay in `.NAME.old` if that fails."""
    final.parent.mkdir(parents=True, exist_ok=True)
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(staging, final)
    if old is None:
        return
    for name in keep:
        if (old / name).exists():
            shutil.rmtree(final / name, ignore_errors=True)
            os.replace(old / name, final / name)
    shutil.rmtree(old, ignore_errors=True)
