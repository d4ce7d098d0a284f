"""The first module mok's fork server imports (`mok.testing.dist`'s preload list), before torch.

- Ctrl-C: the fork server ignores SIGINT from here on (multiprocessing itself only does so once every preload
  module is imported, and importing torch takes seconds: a Ctrl-C then printed a KeyboardInterrupt traceback from
  the fork server). The launcher starts it with SIGINT blocked, and it is unblocked here, once ignored, so no
  Ctrl-C in between reaches Python either. Its workers inherit the setting (they ignore SIGINT anyway: the
  launcher decides).
- Leftovers: multiprocessing puts the fork server's socket in the launching process's own temporary directory
  (`$TMPDIR/pymp-*`), which the launching process removes when it exits, but not when it is killed with SIGKILL.
  The fork server exits when the launching process has gone, however it went, and removes that directory then.

Both act only inside a fork server (multiprocessing.forkserver.main on the stack); imported anywhere else this
module does nothing.
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys


def _in_fork_server() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "main" and code.co_filename.endswith(os.path.join("multiprocessing", "forkserver.py")):
            return True
        frame = frame.f_back
    return False


def _remove_socket_dir() -> None:
    """Remove the directory of this fork server's socket, if it is a multiprocessing temporary directory."""
    from multiprocessing import forkserver

    address = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_address", None)
    if not isinstance(address, str) or not address or address.startswith("\0"):  # none, or an abstract socket
        return
    directory = os.path.dirname(address)
    if os.path.basename(directory).startswith("pymp-"):
        shutil.rmtree(directory, ignore_errors=True)


if _in_fork_server():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    atexit.register(_remove_socket_dir)
