"""
The judge's side of the untrusted kernel process, and its measurement: what bench.py and the
KernelBench scorer (autokernel/kernelbench_score.py) both run.

    ChildRunner   a kernel file in its own process (autokernel/child.py), driven over a pipe;
                  replies are JSON, every wait has a limit; ChildGone when it times out or dies.
                  The process is spawned, or, on a machine without a GPU where the judge
                  started one, forked by its zygote (autokernel/zygote.py)
    measure       paired rounds against the kept version on the judge's clock
                  (autokernel/timing.py), the child's own report cross-checked against it
    timing_case   what the timing runs on (the plan's kind says: autokernel/kinds.py)

Nothing the child says is trusted: it gets inputs and output buffers and answers in JSON; the
verdicts are computed here (autokernel/gate.py, autokernel/timing.py).
"""
import contextlib
import importlib.util
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing

import autokernel as ak
from autokernel import child, kinds, results, sandbox, state, timing, zygote
from autokernel.cli import one_line

STARTUP_LIMIT_S = 60 if ak.CUDA else 180  # a child importing torch and the kernel file
COMPILE_LIMIT_S = 240  # the same for a CUDA C++ kernel file, whose import runs nvcc (uncached)
REQUEST_LIMIT_S = 30 if ak.CUDA else 90   # one call (compiling and autotuning included)
IDLE_LIFE_S = 3600  # the idle kernel's process: the timing's whole length, at most
REPLY_BYTES = 8 << 20  # a timing window describes up to timing.MAX_SETS outputs
CHILD_LOG = ak.WORKSPACE / "bench_child.log"  # the children's stdout and stderr
IDLE_KERNEL = ak.ROOT / "autokernel" / "idle_kernel.py"  # the window floor's (timing.py)


def tampered(changed, confined=False):
    """The reason for a run during which the night's files changed. Confined, the kernel's
    process could not have written them: another process did, and the run is not kept all
    the same (its row would stand on a record someone else changed)."""
    named = f"{', '.join(changed[:5])}{' ...' if len(changed) > 5 else ''}"
    if confined:
        return (f"{named} changed during the run, not by the kernel's process (it was confined): "
                f"restored; never kept")
    return f"the kernel's process changed {named} during the run (restored; never kept)"


def left_running(strays):
    """The reason for a run whose kernel left processes behind (state.end_strays' list)."""
    return (f"the kernel left {len(strays)} process(es) running after its child was stopped "
            f"({strays[0]}); killed")


# ---- the untrusted child, seen from here ----------------------------------------------------

class ChildGone(Exception):
    """The child timed out or died: the row is TIMEOUT or CRASH."""

    def __init__(self, correctness, why):
        super().__init__(why)
        self.correctness, self.why = correctness, why

    def reason(self, log_path):
        line = crash_line(log_path) if self.correctness == "CRASH" else ""
        return self.why + (f": {line}" if line else "")


class ChildRunner:
    """A kernel file in its own process, driven over a pipe; the same calls as child.Runner.
    Replies are JSON (bytes), never unpickled: the child cannot run code in this process."""
    started = []
    log = CHILD_LOG  # a run beside others (a re-gate) gets one of its own

    def __init__(self, kernel_path, deadline, total_limit, source=None):
        self.kernel_path, self.deadline, self.total_limit = str(kernel_path), deadline, total_limit
        self.stage, self.proc, self.conn = "loading the kernel", None, None
        ctx = torch.multiprocessing.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        if not ChildRunner.started:
            self.log.write_text("")
        self.sandbox = sandbox.prepare(source.encode() if source is not None
                                       else Path(kernel_path).read_bytes())
        args = (self.kernel_path, str(self.log), source, self.sandbox)
        forks = zygote.running()  # the CPU's judges fork children with torch already imported
        self.proc = forks and forks.fork(child_conn, args, sandbox.environment(self.sandbox))
        if self.proc is None:  # no zygote, or an unconfined kernel killed it
            self.proc = ctx.Process(target=child.serve, args=(child_conn, *args), daemon=False)
            with sandbox.spawned_with(self.sandbox), main_named_as_the_child():
                self.proc.start()
        child_conn.close()
        ChildRunner.started.append(self)
        self.hello = None
        self.request_limit = REQUEST_LIMIT_S  # what one call may take before it is a hang

    def start(self, limit_s=STARTUP_LIMIT_S):
        """The child's first message (loaded or import_failed), once."""
        if self.hello is None:
            self.hello = self.receive(limit_s)
        return self.hello

    def at(self, stage, where=""):
        self.stage = f"{stage}" + (f" at {where}" if where else "")

    def call(self, inputs, poison, buffer):
        return self.request(("call", inputs, poison, buffer))

    def time(self, inputs, buffer):
        self.at("timing")
        return self.request(("time", inputs, buffer))

    def arm(self, sets, slots):
        return self.request(("arm", sets, slots))

    def window(self):
        return self.request(("window",), spin=ak.CUDA)

    def alone(self):
        """Every other process below the judge stopped while this child's window is timed."""
        forks = zygote.running()  # the zygote answers the judge's exit-code asks meanwhile
        return state.others_stopped(self.proc.pid, also=[forks.pid] if forks else [])

    def ping(self):
        return self.request(("ping",))

    def build(self, init_args, seed, dtype, library=()):
        self.at("building ModelNew")
        return self.request(("build", init_args, seed, dtype, list(library)))

    def request(self, message, spin=False):
        try:
            self.conn.send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            raise self.gone()
        return self.receive(self.request_limit, spin)

    def receive(self, limit_s, spin=False):
        left = self.deadline - time.monotonic()
        # The judge's own work (inputs, the oracle) counts against the limit too: once it is
        # spent, a reply already waiting does not stretch it.
        if left <= 0:
            raise ChildGone("TIMEOUT", f"exceeded the {self.total_limit:g} s wall-clock limit "
                                       f"during {self.stage}")
        wait = min(limit_s, left)
        try:
            if spin:  # a timed window: no wake-up latency of this process on the clock
                until = time.monotonic() + wait
                while not self.conn.poll(0) and time.monotonic() < until:
                    pass
            ready = self.conn.poll(0 if spin else wait)
            data = self.conn.recv_bytes(maxlength=REPLY_BYTES) if ready else None
        except (EOFError, OSError):
            raise self.gone()
        if data is None:
            limit = self.total_limit if left <= limit_s else limit_s
            what = "wall-clock limit" if left <= limit_s else "limit for one call"
            raise ChildGone("TIMEOUT", f"exceeded the {limit:g} s {what} during {self.stage}")
        try:
            reply = json.loads(data)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise ChildGone("FAIL", f"the kernel's process sent a malformed reply during "
                                    f"{self.stage}")
        return reply

    def gone(self):
        self.proc.join(timeout=2)
        code = self.proc.exitcode
        how = describe_exit(code) if code is not None else "stopped answering"
        return ChildGone("CRASH", f"child process {how} during {self.stage}")

    def stop(self):
        """Ask the child to exit (it drops its handles on the judge's shared tensors), then kill
        its process group whatever it does."""
        if self.proc is None or not self.proc.is_alive():
            return
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(("stop",))
            self.proc.join(timeout=1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.join(timeout=5)


@contextlib.contextmanager
def main_named_as_the_child():
    """A spawned process runs the parent's __main__ (bench.py, the scorer: the judge's modules)
    before its target; named autokernel.child instead, it imports that module, which it needs
    anyway (~0.3 s and two dozen modules less a child; none of them ran in it)."""
    main = sys.modules["__main__"]
    saved = getattr(main, "__spec__", None)
    main.__spec__ = importlib.util.find_spec("autokernel.child")
    try:
        yield
    finally:
        main.__spec__ = saved


def describe_exit(code):
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def crash_line(log_path):
    """The most telling line of the children's log (faulthandler's header, else the last)."""
    try:
        lines = [ln.strip() for ln in Path(log_path).read_text(errors="replace").splitlines()
                 if ln.strip()]
    except OSError:
        return ""
    for line in lines:
        if line.startswith("Fatal Python error") or "illegal memory access" in line:
            return one_line(line)
    return one_line(lines[-1]) if lines else ""


# ---- timing ---------------------------------------------------------------------------------

def measure(candidate, kept, plan, best=None, unpaired=None):
    """Paired rounds against the kept version on the judge's clock (autokernel/timing.py), every
    timed output judged; the child's own report cross-checked against that clock. best: the kept
    row, when there is one; unpaired: why its version is not running beside the candidate."""
    windows = f"{timing.WINDOWS_PER_ROUND} window{'s' * (timing.WINDOWS_PER_ROUND > 1)}"
    print(f"timing: {timing.ROUNDS} rounds of {windows}, "
          + ("paired with the kept version" if kept
             else f"alone ({unpaired or 'no kept version to pair with'})"),
          flush=True)
    try:
        rounds = timing.paired_rounds(candidate, kept, timing_case(candidate, kept, plan),
                                      start_idle if ak.CUDA else None)
        claimed = statistics.median(rounds["claimed"])
        judged = statistics.median(rounds["candidate"])
        contradiction = timing.crosscheck(claimed, judged)
        if contradiction:
            raise timing.TimingError(contradiction)
    except timing.TimingError as e:
        return {"correctness": "FAIL", "reason": str(e)}
    if rounds["graph"] is True:
        how = "replayed as a CUDA graph"
    else:
        how = f"plain launches ({rounds['graph'] or 'a CPU: no CUDA graphs'})"
    if rounds["floor_us"]:
        how += f", {rounds['floor_us']:.0f} us a window subtracted (the floor: the judge's idle " \
               "kernel's windows in the same rounds)"
    elif ak.CUDA:
        how += f", nothing subtracted ({rounds['floor_why']})"
    print(f"timing_windows: {rounds['sets']} calls a window, {how}", flush=True)
    if rounds["kept_dropped"]:
        print(f"note: the kept version left the pairing: {rounds['kept_dropped']}", flush=True)
    recorded = float(best["latency_us"]) if best is not None else None
    if rounds["kept"] is None and recorded is not None:  # a kept version, but not timed here
        keep, gain, noise, why = results.keep_rule_against_record(
            rounds["candidate"], recorded,
            f"could not be timed ({unpaired or rounds['kept_dropped']})")
    else:  # the record is only a check where timings mean something (not the interpreter)
        keep, gain, noise, why = results.keep_rule_checked(
            rounds["candidate"], rounds["kept"], recorded if ak.TIMING_MEANINGFUL else None)
    # The row records the judge's clock: the number the keep rule used, and one the kernel's
    # process cannot touch. The child's do_bench median is shown beside it.
    return {"latency_us": judged, "reported_us": claimed, "rounds": rounds["candidate"],
            "kept_rounds": rounds["kept"], "best_us": timing.median(rounds["kept"] or []),
            "faster": keep, "gain": gain, "noise": noise, "keep_why": why,
            "peak_vram_mb": rounds["reply"].get("peak_vram_mb"),
            "timing_valid": ak.TIMING_MEANINGFUL}


def start_idle():
    """The judge's idle kernel (autokernel/idle_kernel.py) in a child, for the window floor. It
    lives through the timing; each of its requests still has REQUEST_LIMIT_S."""
    runner = ChildRunner(IDLE_KERNEL, time.monotonic() + IDLE_LIFE_S, IDLE_LIFE_S)
    try:
        hello = runner.start()
    except ChildGone as e:
        raise timing.TimingError(f"the idle kernel's process: {e.why}") from None
    if hello["status"] != "loaded":
        runner.stop()
        raise timing.TimingError(f"the idle kernel did not load: {hello.get('error')}")
    return runner


def timing_case(candidate, kept, plan):
    """What the timing runs on (a timing.Case), from the plan's kind: fresh inputs of its
    primary shape and dtype from any seed, the oracle, and the tolerance test."""
    runners = [r for r in (candidate, kept) if r is not None]
    return kinds.of(plan["kernel_type"]).timing_case(plan, runners)
