"""
How fast a kernel is, measured so that neither noise nor the kernel's own process decides it.

Paired rounds: the candidate and the best kept version (each in its own untrusted process) are
timed in alternation on the same inputs, ROUNDS times; each round gives a ratio candidate/kept,
and the keep rule (autokernel.results.keep_rule) compares the median ratio with the rounds' spread.

The judge's clock: a runner reports a median (triton.testing.do_bench on a GPU) from inside its
own process, where a kernel can slow every clock. So the judge also times, with its own clock, n
calls of the same kernel run back to back, each after an L2 flush, and subtracts what n flushes
alone take (timed in the judge's process). A flush (~0.2 ms) is longer than a launch, so the GPU
stays busy and launch overhead is hidden. A reported median that this clock contradicts beyond
CROSSCHECK_RATIO and CROSSCHECK_SLACK_US is refused with a named reason.
"""
import statistics
import time

import torch

import autokernel as ak
from autokernel.child import FLUSH_BYTES

ROUNDS = 5
CROSSCHECK_S = 0.1 if ak.CUDA else 0.2  # target length of the judge-timed loop
# The judge's estimate may exceed the report by this factor plus this slack (the pipe, the clock,
# noise; on a CPU the interpreter shares two cores with everything else).
CROSSCHECK_RATIO = 1.25 if ak.CUDA else 2.0
CROSSCHECK_SLACK_US = 5.0 if ak.CUDA else 5_000.0


class TimingError(Exception):
    """The timing failed or was contradicted: the message is the row's reason."""


def paired_rounds(candidate, kept, inputs, make_buffer, on_round=None):
    """Time the candidate (and the kept version, when given) in alternation. Returns
    {"candidate": [us...], "kept": [us...] or None, "reply": the candidate's last reply,
    "buffer": its last output}."""
    times = {"candidate": [], "kept": [] if kept is not None else None}
    reply = buffer = None
    for r in range(ROUNDS):
        order = (("candidate", candidate), ("kept", kept))
        for name, runner in order if r % 2 == 0 else order[::-1]:  # neither always goes first
            if runner is None:
                continue
            out = make_buffer()
            got = runner.time(inputs, out)
            if got.get("status") != "timed":
                who = "the kept version" if name == "kept" else "kernel_fn"
                raise TimingError(f"timing: {who} raised {got.get('error', got.get('status'))}")
            times[name].append(float(got["median_us"]))
            if name == "candidate":
                reply, buffer = got, out
        if on_round:
            on_round(r + 1)
    return {**times, "reply": reply, "buffer": buffer}


def judge_clock_us(runner, inputs, claimed_us, ping):
    """The judge's own estimate of one call: n flushed calls timed from here, minus n flushes
    timed here and the pipe's round trip. `ping()` times one empty round trip."""
    flush = ak.CUDA
    per_call_guess = max(claimed_us, 1.0) + (flush_us() if flush else 0.0)
    n = int(min(max(CROSSCHECK_S * 1e6 / per_call_guess, 2), 2000 if ak.CUDA else 20))
    rtt = min(ping() for _ in range(3))
    start = time.perf_counter()
    got = runner.loop(inputs, n, flush)
    wall = time.perf_counter() - start
    if got.get("status") != "looped":
        raise TimingError(f"timing: kernel_fn raised {got.get('error', got.get('status'))}")
    flushes = flush_seconds(n) if flush else 0.0
    return max(wall - rtt - flushes, 0.0) / n * 1e6


def crosscheck(claimed_us, judged_us, who="the kernel's process"):
    """None when the judge's clock agrees with the report, else the reason to refuse it."""
    if judged_us <= CROSSCHECK_RATIO * claimed_us + CROSSCHECK_SLACK_US:
        return None
    return (f"timing contradicted: {who} reported {claimed_us:.1f} us per call, the judge's "
            f"clock measured {judged_us:.1f} us (over {CROSSCHECK_RATIO:g}x + "
            f"{CROSSCHECK_SLACK_US:g} us): timed differently from how it ran")


_flush = {}


def flush_seconds(n):
    """Wall time of n L2 flushes in this process (what the runner's loop adds per call)."""
    buf = _flush.setdefault("buf", torch.empty(FLUSH_BYTES // 4, dtype=torch.int32,
                                                device="cuda"))
    buf.zero_()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        buf.zero_()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def flush_us():
    return flush_seconds(20) / 20 * 1e6


def median(values):
    return statistics.median(values) if values else None
