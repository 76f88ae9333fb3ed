"""Removing a python-tool work dir whatever the snippet left in it: `remove_tree`.

`shutil.rmtree` recurses once per directory level (a chain about a thousand deep raises `RecursionError`), builds
full paths (a deep chain passes ``PATH_MAX``) and gives up on directories the snippet made unreadable or
unwritable. `remove_tree` walks with directory file descriptors, one level open at a time, and a list of names
instead of the call stack: it goes down by ``openat(name)`` and back up by ``openat("..")``, so neither the
depth nor the length of a path matters. Each directory is set to 0700 before it is entered, so modes the
snippet chose (000, 0500) do not stop it. Symlinks are removed, never followed.

It expects nothing to run in the tree any more (the snippet's processes are dead when it is called): it does
not defend against renames happening while it walks; an entry someone else removed meanwhile is no error. It
knows directories; it knows nothing about sandboxes.
"""

from __future__ import annotations

import contextlib
import os
from typing import Final

__all__ = ["remove_tree"]

_DIRECTORY: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dir(name: str, dir_fd: int | None = None) -> int:
    """Make the directory `name` ours to empty (0700), then open it (never through a symlink)."""
    with contextlib.suppress(OSError, NotImplementedError):  # a symlink has no mode to set: the open then fails
        os.chmod(name, 0o700, dir_fd=dir_fd, follow_symlinks=False)
    return os.open(name, _DIRECTORY, dir_fd=dir_fd)


def _clear_files(fd: int) -> list[str]:
    """Unlink everything in the directory `fd` except subdirectories; return the subdirectories' names."""
    subdirectories = []
    with os.scandir(fd) as entries:
        names = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
    for name, is_dir in names:
        if is_dir:
            subdirectories.append(name)
        else:
            with contextlib.suppress(FileNotFoundError):  # already gone is what we want
                os.unlink(name, dir_fd=fd)
    return subdirectories


def remove_tree(path: str) -> None:
    """Remove `path` and everything beneath it, iteratively. A missing `path` is not an error.

    Raises OSError only for what even the owner of the tree cannot remove (a mount point, a file under
    ``chattr +i``); everything else is gone when it returns.
    """
    try:
        fd = _open_dir(path)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        os.unlink(path)
        return
    # frames[i] = (this directory's name in its parent, its subdirectories still to remove); fd is the last one's
    frames: list[tuple[str | None, list[str]]] = [(None, _clear_files(fd))]
    try:
        while frames:
            name, pending = frames[-1]
            if pending:
                child = pending.pop()
                try:
                    child_fd = _open_dir(child, fd)
                except FileNotFoundError:
                    continue
                os.close(fd)
                fd = child_fd
                frames.append((child, _clear_files(fd)))
                continue
            frames.pop()
            if name is None:
                break
            parent = os.open("..", _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = parent
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(name, dir_fd=fd)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(path)
