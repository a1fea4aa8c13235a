"""Where a build writes: a temporary sibling of the output, renamed over it only when complete.

Nothing of the user's is lost: `--force` replaces only an engine (a directory holding this tool's
manifest.json) or an empty directory. The sibling is `.NAME.building-PID-START-XXXX`; it is removed
on any failure, Ctrl-C, SIGTERM or SIGHUP, and one left by a killed build (SIGKILL) is swept by the
next build of the same output once its process (PID, started at START) is gone. The finished engine
gets the user's umask, like any build output (mkdtemp makes 0700 directories, safetensors 0600 files).
While a build runs it holds a lock beside the output (`.NAME.lock`), so two builds of one output at once
cannot both write it: the second is refused in one line.
"""

from __future__ import annotations

import fcntl
import glob
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import DFlashError
from .interrupts import signals_raise


def check_output(out: Path, force: bool, ours: Callable[[Path], bool], kind: str) -> None:
    """Refuse, before anything is built, an output this build must not replace: with force, only `kind` (a
    directory `ours` accepts) or an empty directory is replaced."""
    if out.is_symlink():
        raise DFlashError(f"output {out} is a symbolic link: give the directory it points to")
    if not out.exists():
        return
    if not out.is_dir():
        raise DFlashError(f"output {out} exists and is not a directory")
    if not force:
        raise DFlashError(f"output {out} already exists (use --force to replace it)")
    if any(out.iterdir()) and not ours(out):
        raise DFlashError(f"--force replaces only {kind} or an empty one, and "
                          f"{out} is neither: remove it yourself or choose another output")


@contextmanager
def building(out: Path) -> Iterator[Path]:
    """-> an empty temporary sibling of `out`, the output's lock held; removed unless `publish` renamed it into
    place. A write that fails (a full disk, an I/O error) is one line, after the sibling is removed."""
    with output_lock(out):
        sweep_stale(out)
        me = os.getpid()
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-{me}-{start_time(me)}-", dir=out.parent))
        try:
            with signals_raise():
                yield tmp
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise DFlashError(f"writing {out} failed: {exc.strerror or exc}; nothing was left behind") from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


@contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """An exclusive flock on `.NAME.lock` beside `out` while it is built: a second build of the same output at the
    same time is refused at once (the kernel drops the lock however the holder ends, SIGKILL too). The file names
    its holder's pid and is removed by it; a holder re-checks that the path is still the file it locked."""
    path = out.parent / f".{out.name}.lock"
    for _ in range(3):  # the previous holder may remove the file between our open and our lock
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as exc:
            raise DFlashError(f"cannot write under {out.parent}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise DFlashError(f"another dflash-build (pid {holder}) is writing {out}; wait for it or stop it") \
                from None
        if same_file(fd, path):
            break
        os.close(fd)
    else:
        raise DFlashError(f"cannot lock {path}: it keeps being replaced")
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        path.unlink(missing_ok=True)  # before the lock is released: a waiter then sees a new file
        os.close(fd)


def same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def publish(tmp: Path, out: Path) -> None:
    """Rename the finished build over `out`; the replaced engine is removed only once the new one is in place."""
    apply_umask(tmp)
    if not out.exists():
        tmp.rename(out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.replaced-", dir=out.parent))
    out.rename(old / out.name)
    try:
        tmp.rename(out)
    except BaseException:
        (old / out.name).rename(out)
        raise
    shutil.rmtree(old)


def sweep_stale(out: Path) -> None:
    """Remove temporary siblings of `out` whose build process is gone; refuse while one is alive."""
    pattern = re.compile(rf"\.{re.escape(out.name)}\.building-(\d+)-(\d+)-\w+")
    for path in out.parent.glob(f".{glob.escape(out.name)}.building-*"):
        match = pattern.fullmatch(path.name)
        if not match or not path.is_dir() or path.is_symlink():
            continue
        pid, started = int(match[1]), int(match[2])
        if alive(pid, started):
            raise DFlashError(f"another dflash-build (pid {pid}) is writing {out}; wait for it or stop it")
        shutil.rmtree(path, ignore_errors=True)


def start_time(pid: int) -> int:
    """Process start time in clock ticks since boot (Linux /proc; 0 elsewhere): tells a reused pid apart."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def alive(pid: int, started: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: exists
        pass
    return start_time(pid) in (started, 0)


def apply_umask(root: Path) -> None:
    mask = current_umask()
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            executable = path.is_dir() or path.stat().st_mode & 0o111
            path.chmod((0o777 if executable else 0o666) & ~mask)


def current_umask() -> int:
    mask = os.umask(0o022)  # the only way to read it portably; restored at once
    os.umask(mask)
    return mask
