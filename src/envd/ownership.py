"""Whether a file or folder the client is about to use is safe from other users.

The client uses two things it did not create: the default socket folder
(``$XDG_RUNTIME_DIR``, or ``/tmp/envd-$UID``, where any user could have made
it first and put their own daemon's socket in it) and each session's
shared-memory segment (which carries observations and actions).  Both must
belong to this process's user or to root, and be writable by nobody else.
The checks take a stat result, so callers decide how they got it: lstat for
a folder (a symlink is refused), fstat on the opened descriptor for a
segment (the file checked is the file mapped: no race with a rename).
"""
from __future__ import annotations

import os
import stat


def untrusted_reason(info: os.stat_result, is_dir: bool) -> str | None:
    """Why a file or folder with this stat must not be trusted, or None."""
    if is_dir and not stat.S_ISDIR(info.st_mode):
        return "it is not a directory (a symlink or another kind of file)"
    if not is_dir and not stat.S_ISREG(info.st_mode):
        return "it is not a regular file"
    euid = os.geteuid()
    if info.st_uid not in (euid, 0):
        return f"it belongs to uid {info.st_uid}, not to this process's uid {euid} or root"
    mode = stat.S_IMODE(info.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"its mode {mode:#o} lets other users write it"
    return None
