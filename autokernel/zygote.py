"""
The kernel processes' parent on a machine without a GPU: a copy of the judge made before it
computes anything, with torch, Triton and the child's modules already imported, that forks each
kernel's process on the judge's request. A spawned child imports torch and Triton itself (~2.7 s
of CPU on the CPU interpreter's machines, two or three times a bench.py run); a forked one starts
with them in memory.

    start()       at the top of a judge (bench.py, the KernelBench scorer), before any torch
                  compute: no thread pool or computed value is in the copy
    running()     the zygote of this process, or None (then autokernel/judge.py spawns)
    Zygote.fork   a child process running child.serve, seen as a Forked (pid, exit code)

Only without a GPU: the judge's CUDA check at import (torch.cuda.is_available) has initialized the
CUDA driver, which a forked process cannot use; with a GPU, children are spawned.

Trust: the zygote holds only what the judge imported; it talks to the judge over an anonymous
socket pair that each forked child closes first, so a kernel has no way to ask it for anything.
A forked child then runs exactly what a spawned one runs (autokernel/child.py: its own session,
the log, the sandbox before the kernel's code). The zygote dies with the judge (PDEATHSIG), and
its children with it; it reaps them and tells the judge their exit codes.
"""
import ctypes
import os
import signal
import sys
import time
import traceback
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle

import autokernel as ak

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
POLL_S = 0.02  # the zygote's reaping period and the judge's wait between exit-code asks
_ZYGOTE = None


def start():
    """Fork this process's zygote (once; not with a GPU). Returns it, or None."""
    global _ZYGOTE
    if _ZYGOTE is None and not ak.CUDA and sys.platform.startswith("linux"):
        _ZYGOTE = Zygote()
    return _ZYGOTE


def running():
    """This process's zygote (not a copy of the judge's object in a forked process), or None."""
    return _ZYGOTE if _ZYGOTE is not None and _ZYGOTE.owner == os.getpid() else None


class Zygote:
    def __init__(self):
        import triton  # noqa: F401  (what every kernel file imports, in the copy)
        import triton.language  # noqa: F401
        from autokernel import child, contract, sandbox  # noqa: F401  (the child's own)
        self.judge_end, zygote_end = Pipe(duplex=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self.owner = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:  # the zygote
            try:
                self.judge_end.close()
                _serve(zygote_end)
            finally:
                os._exit(0)
        zygote_end.close()

    def fork(self, conn, args, environment):
        """A child running child.serve(conn, *args) with `environment` in os.environ, as a
        Forked; None where the zygote is gone. conn is the child's end of its pipe (the judge
        closes its own copy)."""
        try:
            self.judge_end.send(("fork", args, environment))
            send_handle(self.judge_end, conn.fileno(), self.pid)
            return Forked(self, self.judge_end.recv())
        except (EOFError, OSError):
            return None

    def exit_code(self, pid):
        """The child's exit code (negative: the signal that killed it), None while it runs."""
        try:
            self.judge_end.send(("status", pid))
            return self.judge_end.recv()
        except (EOFError, OSError):  # killed (by an unconfined kernel): its children died with
            return _orphan_exit_code(pid)  # it and came to the judge, the subreaper


class Forked:
    """A forked child as the judge sees it: the parts of multiprocessing.Process it uses."""

    def __init__(self, zygote, pid):
        self.zygote, self.pid, self.exitcode = zygote, pid, None

    def is_alive(self):
        if self.exitcode is None:
            self.exitcode = self.zygote.exit_code(self.pid)
        return self.exitcode is None

    def join(self, timeout=None):
        until = None if timeout is None else time.monotonic() + timeout
        while self.is_alive() and (until is None or time.monotonic() < until):
            time.sleep(POLL_S)


def _orphan_exit_code(pid):
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not ours: gone, or running under another parent
        return None if os.path.exists(f"/proc/{pid}") else -signal.SIGKILL
    return None if got == 0 else _code(status)


def _code(status):
    """A wait status as multiprocessing's exitcode: negative for the signal that killed it."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


# ---- the zygote's side --------------------------------------------------------------------------

def _serve(conn):
    """Answer the judge until it closes the pipe or dies; reap every child meanwhile."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the judge's to handle
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    libc.prctl(PR_SET_NAME, b"ak-zygote")  # ps -o comm tells it from the judge (same cmdline)
    if os.getppid() == 1:  # the judge died before the line above
        return
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(3, conn.fileno())  # nothing of the judge's (its files, locks) stays open
    os.closerange(conn.fileno() + 1, os.sysconf("SC_OPEN_MAX"))
    codes = {}
    while True:
        _reap(codes)
        try:
            if not conn.poll(POLL_S):
                continue
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "status":
            _reap(codes)
            conn.send(codes.get(message[1]))
        elif message[0] == "fork":
            _, args, environment = message
            fd = recv_handle(conn)
            pid = os.fork()
            if pid == 0:
                _become_child(conn, fd, args, environment)
            os.close(fd)
            conn.send(pid)


def _reap(codes):
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        codes[pid] = _code(status)


def _become_child(conn, fd, args, environment):
    code = 1
    try:
        conn.close()  # the kernel gets no handle on the zygote
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.environ.update(environment)
        from autokernel import child
        child.serve(Connection(fd), *args)
        code = 0
    except BaseException:  # noqa: B036  (as multiprocessing does: the traceback, exit code 1)
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
