"""dflash-serve's children end with it, even when it is killed without a chance to stop them.

tritonserver and the OpenAI frontend run in sessions of their own (so a terminal's Ctrl-C reaches dflash-serve
alone, which stops them in order). A dflash-serve killed by SIGKILL (the OOM killer, a scheduler's hard kill)
cannot stop them, and they would keep the ports and the model's memory. Linux's parent-death signal
(prctl(2) PR_SET_PDEATHSIG) has the kernel send each child SIGTERM when its parent dies, which tritonserver answers
with its ordered exit (models unloaded, --exit-timeout-secs). A short stub sets it in the child and then execs the
real command: the setting survives execve(2) (not into set-user-ID programs), and no preexec_fn runs in a forked
copy of a threaded process. The signal follows the parent *thread*: start children from the main thread.
"""

from __future__ import annotations

import os
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# argv: parent pid, the program, its arguments. A parent that died before prctl took effect left the stub
# re-parented: it exits rather than run an orphan.
STUB = ("import ctypes, os, signal, sys; "
        f"ctypes.CDLL(None, use_errno=True).prctl({PR_SET_PDEATHSIG}, signal.SIGTERM); "
        "os.getppid() == int(sys.argv[1]) or sys.exit(1); "
        "os.execvp(sys.argv[2], sys.argv[2:])")


def ending_with_parent(command: list[str]) -> list[str]:
    """`command` run so that it gets SIGTERM when this process dies (Linux; elsewhere `command` unchanged)."""
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, "-c", STUB, str(os.getpid()), *command]
