"""
How fast a kernel is, measured so that neither noise nor the kernel's own process decides it.

The judge's clock times windows. In a window the kernel's process runs one call on each of n input
sets the judge made, back to back, and answers once all n are done; the judge's wall clock over
that request, divided by n, is one latency. What the kernel's process controls cannot make it
look faster:
- before every window the judge rewrites every set with fresh random values and flushes the L2
  cache: no answer can be cached or prepared, and each set is read cold from memory, as a layer
  of a model reads its activations;
- the clock stops once the judge has read a few elements of a few outputs picked at random; then
  it copies every output out of the kernel's process (CUDA IPC from the graph's outputs; else the
  process fills the judge's slots) and checks each against the oracle of its set, and the early
  reads against the copies: no call can be skipped, answered from a cache or left running after
  the answer without failing (or, for a few calls, a good chance of failing);
- nothing the kernel's process could leave out is subtracted from the wall clock (subtracting work
  it was trusted to do would reward skipping it): only the floor of a window, what every process
  pays for one and none can skip (the pipe both ways, the GPU switching from the judge's context to
  the kernel's and back for the reads): the median window of an idle kernel of the judge's own (one
  tiny copy, in its own process), taken in the same rounds as the kernels' windows, in turn in every
  position. While a window runs, the judge and the kernel's process poll their pipe rather than
  sleep on it, and every other process below the judge is stopped (SIGSTOP), so no kernel's process
  can take a CPU or launch GPU work during another's window (GPU work it queued before answering
  still runs; a kept version slowed that way is held to its record: results.keep_rule_checked).
  Inside a child the GPU time of a window's graph is the judge's own (CUDA events, H100: 46.3 us a
  call against 46.6); with the floor taken once, before the sets existed, windows through a child
  read 7-9% slower than the same code in the judge's process, where the baselines are timed; with
  the floor in the rounds, 0.999-1.004x (reduce, softmax, matmul; rotary's 2.5 ms windows, where the
  floor is a quarter of the window, 1.085x in one run).
On a GPU the kernel's process captures the window's calls in one CUDA graph when it can, so
launch overhead does not count (as in a model under CUDA graphs); a kernel that cannot be captured
is timed as plain launches, each output copied into a slot, overhead included. Back-to-back calls
on fresh memory pay what do_bench's flush hides (the write-back of the last call's output, fresh
pages). prepare.py times the baselines (eager, the library op, torch.compile) on the same
windows in the judge's process (trusted_window_us).

The kernel's process also reports its own do_bench median; a report that the judge's clock
contradicts beyond CROSSCHECK_RATIO and CROSSCHECK_SLACK_US is refused with a named reason.

Paired rounds: the candidate and the best kept version (each in its own untrusted process) are
timed in alternation on the same sets, ROUNDS times after one discarded warm-up round (on the
H100 the first timed round of a process ran ~4% faster than the rest), a round being the mean of
WINDOWS_PER_ROUND windows; each round gives a ratio candidate/kept of the judge's clock, and the
keep rule (autokernel.results.keep_rule) compares the median ratio with the rounds' spread. A
kept version that fails its windows leaves the pairing (bench.py then holds the candidate to the
kept version's recorded latency).
"""
import base64
import contextlib
import os
import random
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

import autokernel as ak
from autokernel.gate import bits, fresh_seed, tensors

ROUNDS = 5 if ak.CUDA else 3  # interpreter timings rank nothing: fewer rounds, same rule
# A round's time is the mean of this many windows, each on fresh sets: one ~2-5 ms window
# varied ~3% (the keep rule's noise over 5 rounds was ~6%); four, ~3% (H200).
WINDOWS_PER_ROUND = 4 if ak.CUDA else 1
WARMUP_ROUNDS = 1 if ak.CUDA else 0  # interpreter rounds are slow and have no clocks to settle
WINDOW_S = 0.01  # target length of one window of calls (GPU)
MAX_SETS = 2000 if ak.CUDA else 2  # the interpreter: two calls show a cache, seconds each
WINDOW_BYTES = 16 << 30  # at most, for the windows' sets and outputs (and a third of free memory)
FLUSH_BYTES = 512 << 20  # larger than any L2
SAMPLED_OUTPUTS, SAMPLED_ELEMENTS = 4, 64  # read before the clock stops (window_wall)
SHM = "/dev/shm"  # where shm_open's names live on Linux (torch's IPC reference counters)
# The judge's clock may exceed the report by this factor plus this slack (the pipe, the clock,
# noise; on a CPU the interpreter shares two cores with everything else).
CROSSCHECK_RATIO = 1.5 if ak.CUDA else 3.0
CROSSCHECK_SLACK_US = 2.0 if ak.CUDA else 5_000.0


class TimingError(Exception):
    """The timing failed or was contradicted: the message is the row's reason."""


@dataclass
class Case:
    """What a kernel is timed on: make(seed) -> a fresh input set (the same seed, the same
    values), reference(inputs) -> the oracle's output, wrong(out, ref, inputs) -> True when out
    misses the tolerance, and the output's shape and dtype."""
    make: Callable
    reference: Callable
    wrong: Callable
    out_shape: tuple
    out_dtype: torch.dtype

    def blank(self):
        fill = float("nan") if self.out_dtype.is_floating_point else 0
        return torch.full(self.out_shape, fill, dtype=self.out_dtype, device=ak.DEVICE)


BEHAVES = "behaves differently when timed"


def paired_rounds(candidate, kept, case, start_idle=None):
    """Time the candidate (and the kept version, when given) in alternating windows, less the
    window floor: the idle windows of start_idle() (the judge's idle runner; None: no floor),
    taken in the same rounds. Returns {"candidate": [judge us...], "kept": [judge us...] or
    None, "claimed": the candidate's own do_bench medians, "reply": its report, "graph": True
    when its windows replayed a CUDA graph, else why not ("" on a CPU), "kept_dropped": why the
    kept version left the pairing, or None, "sets": calls a window, "floor_us": what was
    subtracted from each window, "floor_why": why nothing was, or ""}."""
    seed = fresh_seed()
    inputs = case.make(seed)
    reply = candidate.time(inputs, buffer := case.blank())
    if reply.get("status") != "timed":
        raise TimingError(f"timing: kernel_fn raised {reply.get('error', reply.get('status'))}")
    pristine = case.make(seed)
    if not unchanged(inputs, pristine) or case.wrong(buffer, case.reference(pristine),
                                                          pristine):
        raise TimingError(f"timing: a timed call's output differs from the oracle (or it changed "
                          f"its inputs): {BEHAVES}")
    claimed = float(reply["median_us"])
    del inputs, buffer, pristine
    runners = {"candidate": candidate, "kept": kept}
    sets = window_sets(case, claimed, len([r for r in runners.values() if r is not None]))
    # Where the outputs are read: a CUDA graph's own outputs (CUDA IPC), else the judge's slots.
    where, graph, dropped = {}, None, None
    for name, runner in list(runners.items()):
        if runner is None:
            continue
        try:
            where[name] = arm(runner, sets, case)
        except TimingError as e:
            if name == "candidate":
                raise TimingError(f"timing: {e}") from None
            runners["kept"], dropped = None, str(e)
        if name == "candidate":
            graph = True if not isinstance(where[name], Slots) else where[name].why
    idle, floor_why = start_floor(start_idle)
    walls = {"candidate": [], "kept": [], "idle": []}  # per timed round: its windows' mean, s
    try:
        r = -WARMUP_ROUNDS
        while r < ROUNDS:
            took, spoiled = {}, False
            for k in range(WINDOWS_PER_ROUND):
                try:
                    got = paired_window(runners, where, case, sets, idle,
                                        turn=r * WINDOWS_PER_ROUND + k)
                except KeptDropped as e:  # the round again, without the kept version
                    runners["kept"], dropped, spoiled = None, str(e), True
                    break
                except IdleFailed as e:  # the round again, with nothing subtracted (the honest
                    idle, floor_why, spoiled = idle.stop(), f"the idle kernel failed: {e}", True
                    break  # error's direction)
                for name, wall in got.items():
                    took[name] = took.get(name, 0.0) + wall / WINDOWS_PER_ROUND
            if spoiled:
                continue
            if r >= 0:
                for name, wall in took.items():
                    walls[name].append(wall)
            r += 1
    finally:
        if idle is not None:
            idle.stop()
    floor_s = median(walls["idle"]) if idle is not None and walls["idle"] else 0.0
    per_call = lambda ws: [max(w - floor_s, 0.0) / len(sets) * 1e6 for w in ws]  # noqa: E731
    return {"candidate": per_call(walls["candidate"]),
            "kept": per_call(walls["kept"]) if runners["kept"] is not None else None,
            "claimed": [claimed], "reply": reply, "graph": graph, "kept_dropped": dropped,
            "sets": len(sets), "floor_us": floor_s * 1e6, "floor_why": floor_why}


class KeptDropped(Exception):
    """The kept version failed a window: why (it leaves the pairing; the candidate goes on)."""


class IdleFailed(Exception):
    """The judge's idle kernel failed a window: why (the run goes on without a floor)."""


def paired_window(runners, where, case, sets, idle, turn):
    """One window for each runner on the same freshly rewritten sets, every output checked, and
    one of the idle kernel (when there is one): {name: wall s of the whole window, "idle" too}.
    The order turns with `turn`, so no runner always goes first; an untimed idle window comes
    right after the rewrite (on the H100 the first window after it read ~400 us longer, which
    would otherwise fall on one runner). A failing candidate raises TimingError, a failing kept
    version KeptDropped, a failing idle kernel IdleFailed."""
    seeds = refresh(case, sets)
    order = [(name, runner, where[name]) for name, runner in runners.items() if runner]
    if idle is not None:
        idle.refresh()
        idle.window()  # settles the GPU after the rewrite; not timed
        order.append(("idle", idle.runner, idle.outputs))
    order = order[turn % len(order):] + order[:turn % len(order)]
    took, outputs = {}, {}
    for name, runner, outs in order:
        if name == "idle":
            took[name] = idle.window()
            continue
        try:
            took[name], outputs[name] = window_wall(runner, name, outs)
            changed = changed_set(case, sets, seeds)
            if changed is not None:
                raise TimingError(f"timing: input set {changed} was changed during its "
                                  f"window: {BEHAVES}")
        except TimingError as e:
            if name == "candidate":
                raise
            raise KeptDropped(str(e)) from None
    for name, why in wrong_outputs(case, sets, outputs).items():
        if name == "candidate":
            raise TimingError(f"timing: {why}: {BEHAVES}")
        raise KeptDropped(why)
    return took


def kernel_case(ktype, shape, dtype, variant=None):
    """The Case of a type of the KernelType table at one shape, dtype and variant."""
    def make(seed):
        gen = torch.Generator(device=ak.DEVICE)
        gen.manual_seed(seed)
        return ktype.inputs(shape, dtype, ak.DEVICE, gen, variant)

    first = make(0)
    shape_of = ktype.eager(**first)  # the oracle's output shape, without an fp64 oracle run
    return Case(make=make, reference=lambda inputs: ktype.reference(**inputs),
                wrong=lambda out, want, inputs: bool(ktype.mismatches(out, want, inputs)[0].any()),
                out_shape=tuple(shape_of.shape), out_dtype=ak.out_dtype(ktype, first))


def trusted_window_us(fn, case, guess_us):
    """The same clock for a function of the judge's own (a baseline: eager, the library op,
    torch.compile), run here: fresh sets, an L2 flush and one CUDA graph a window, less what
    only an untrusted process needs (the pipe, the reads). The median of ROUNDS windows."""
    sets = window_sets(case, guess_us, 1)
    for inputs in sets[:2]:
        fn(**inputs)
    graph = torch.cuda.CUDAGraph() if ak.CUDA else None
    try:
        if graph is not None:
            with torch.cuda.graph(graph):
                outs = [fn(**inputs) for inputs in sets]  # noqa: F841  (the graph's outputs)
    except Exception:  # noqa: BLE001  (not capturable: plain launches, as for a kernel)
        graph = None
    times = []
    for r in range(-WARMUP_ROUNDS, ROUNDS):
        refresh(case, sets)
        flush_l2()
        start = time.perf_counter()
        if graph is not None:
            graph.replay()
        else:
            for inputs in sets:
                fn(**inputs)
        if ak.CUDA:
            torch.cuda.synchronize()
        if r >= 0:
            times.append((time.perf_counter() - start) / len(sets) * 1e6)
    return statistics.median(times)


class Slots(list):
    """Output buffers of the judge's that the kernel's process copies its outputs into."""


def arm(runner, sets, case):
    """Hand the sets to a runner: on a GPU it captures its calls in a CUDA graph, whose outputs
    are opened here; where that fails (and on a CPU) it gets slots for its outputs."""
    got = runner.arm(sets, None) if ak.CUDA else {"status": "armed", "graph": False}
    if got.get("status") == "armed" and not got.get("graph"):
        slots = Slots(case.blank() for _ in sets)
        slots.why = str(got.get("note") or "")[:300]  # why not a graph: the agent should know
        got = runner.arm(sets, list(slots))
        if got.get("status") == "armed":
            return slots
    if got.get("status") != "armed":
        raise TimingError(f"kernel_fn raised {got.get('error', got.get('status'))}")
    return opened(got.get("outputs"), case, len(sets))


def window_sets(case, claimed_us, runners):
    """n input sets for the windows: enough calls to fill WINDOW_S, as many as WINDOW_BYTES
    holds (each set; per runner its output and the judge's copy), at least one."""
    first = case.make(fresh_seed())
    set_bytes = sum(t.numel() * t.element_size() for t in tensors(first).values())
    out_bytes = torch.Size(case.out_shape).numel() * torch.empty(0, dtype=case.out_dtype
                                                                 ).element_size()
    wanted = int(WINDOW_S * 1e6 / max(claimed_us, 1.0)) if ak.CUDA else MAX_SETS
    budget = min(WINDOW_BYTES, torch.cuda.mem_get_info()[0] // 3) if ak.CUDA else WINDOW_BYTES
    fits = budget // max(set_bytes + 2 * runners * out_bytes, 1)
    n = max(1, min(wanted, MAX_SETS, fits))
    return [first] + [case.make(fresh_seed()) for _ in range(n - 1)]


def refresh(case, sets):
    """New random values in every set, in place (the kernel's processes hold these tensors).
    Returns the seeds that make each set again. The L2 flush comes later, right before the
    clock starts (window_wall, trusted_window_us)."""
    seeds = [fresh_seed() for _ in sets]
    for held, seed in zip(sets, seeds):
        for key, t in case.make(seed).items():
            if isinstance(t, torch.Tensor):
                held[key].copy_(t)
    return seeds


def window_wall(runner, name, outputs):
    """One window on the judge's clock: (wall s of the whole window, copies of its outputs).
    Every other process below the judge is stopped meanwhile (runner.alone()). The clock stops
    once a few elements of a few outputs, picked at random, are read here (the time those reads
    take here is not counted); the copies come after and must agree with them, so work the
    kernel's process leaves running after its answer is either on the clock or caught."""
    who = {"kept": "the kept version", "idle": "the idle kernel"}.get(name, "kernel_fn")
    picks = sorted(random.sample(range(len(outputs)), min(SAMPLED_OUTPUTS, len(outputs))))
    at = [tuple(torch.randint(0, s, (SAMPLED_ELEMENTS,), device=ak.DEVICE)
                for s in outputs[i].shape) for i in picks]
    with getattr(runner, "alone", contextlib.nullcontext)():
        flush_l2()
        start = time.perf_counter()
        got = runner.window()
        if got.get("status") != "windowed":
            raise TimingError(f"timing: {who} raised {got.get('error', got.get('status'))}")
        seen = sample(outputs, picks, at)
        wall = time.perf_counter() - start
    copies = [out.clone() for out in outputs]
    if ak.CUDA:
        torch.cuda.synchronize()
    started = time.perf_counter()  # the same reads of outputs that are done: what they cost
    again = sample(copies, picks, at)
    wall -= time.perf_counter() - started
    if any(not torch.equal(bits(a), bits(b)) for a, b in zip(seen, again)):
        raise TimingError(f"timing: {who}'s outputs changed after it answered (work left "
                          f"running past the clock): {BEHAVES}")
    return max(wall, 0.0), copies


class Idle:
    """The judge's idle kernel (autokernel/idle_kernel.py: one tiny copy) in a process of its
    own, armed on SAMPLED_OUTPUTS sets of its own, so its window ends with the same reads as a
    real one. Its windows' median is the floor: what any process's window costs (the pipe both
    ways, the GPU switching contexts, the reads) and none can skip, taken in the same rounds
    as the kernels' windows (the same rewrites and memory held, a turn in every position): an idle
    window measured on its own, before the sets existed, read ~350 us where the same idle
    window between real ones read 520-1,100 (H100), and the difference fell on the kernels."""

    def __init__(self, runner):
        self.runner, self.case = runner, idle_case()
        self.sets = [self.case.make(fresh_seed()) for _ in range(SAMPLED_OUTPUTS)]
        self.outputs = arm(runner, self.sets, self.case)

    def refresh(self):
        refresh(self.case, self.sets)

    def window(self):
        try:
            return window_wall(self.runner, "idle", self.outputs)[0]
        except Exception as e:  # noqa: BLE001  (the judge's own kernel: not the candidate's)
            raise IdleFailed(str(e)) from None

    def stop(self):
        self.runner.stop()


def start_floor(start_idle):
    """(an armed Idle, "") or (None, why there is no floor): no idle runner (a CPU, where a
    window takes seconds and the floor ~0.1 ms), or one that fails to start or arm."""
    if start_idle is None:
        return None, "no idle kernel"
    try:
        runner = start_idle()
    except TimingError as e:  # nothing subtracted: the honest error's direction
        return None, str(e)
    try:
        return Idle(runner), ""
    except Exception as e:  # noqa: BLE001  (the judge's own kernel: not the candidate's)
        runner.stop()
        return None, f"the idle kernel failed: {e}"


def idle_case():
    """The idle kernel's case: 256 floats, copied."""
    def make(seed):
        gen = torch.Generator(device=ak.DEVICE)
        gen.manual_seed(seed)
        return {"x": torch.rand(256, device=ak.DEVICE, generator=gen)}
    return Case(make=make, reference=lambda inputs: inputs["x"],
                wrong=lambda out, want, inputs: not torch.equal(out, want),
                out_shape=(256,), out_dtype=torch.float32)


def sample(outputs, picks, at):
    seen = [outputs[i][where] for i, where in zip(picks, at)]
    if ak.CUDA:
        torch.cuda.synchronize()
    return seen


def opened(described, case, n):
    """A CUDA graph's n outputs in the kernel's process, opened here by CUDA IPC."""
    try:
        if not isinstance(described, list) or len(described) != n:
            raise ValueError(f"expected {n} output descriptions")
        return [shared_tensor(d, case) for d in described]
    except (TypeError, ValueError, KeyError, RuntimeError) as e:
        raise TimingError(f"its window outputs are unreadable ({e}): {BEHAVES}") from None


def shared_tensor(d, case):
    """A CUDA tensor of the kernel's process, opened here by CUDA IPC from its description once
    described_view has checked every field."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor
    shape, stride, offset, size, base, counter, counter_at = described_view(d, case)
    t = rebuild_cuda_tensor(torch.Tensor, torch.Size(shape), tuple(stride), offset,
                            torch.UntypedStorage, case.out_dtype, int(d["device"]),
                            base64.b64decode(d["handle"]), size, base, False, counter,
                            counter_at, b"", False)
    # Opening maps the handle's whole allocation and trusts the described storage to lie inside
    # it: one reaching past it would make the judge's first read a fault that kills the judge,
    # or read the judge's own memory as the kernel's output.
    ptr = t.untyped_storage().data_ptr()
    start, length = mapped_range(ptr - base)
    if start != ptr - base or ptr + size > start + length:
        raise ValueError("an output description larger than the memory it names")
    return t


def mapped_range(ptr):
    """(base, bytes) of the device allocation holding address ptr (the CUDA driver's own
    answer, cuMemGetAddressRange)."""
    import ctypes
    base, length = ctypes.c_uint64(), ctypes.c_size_t()
    if "libcuda" not in _state:
        _state["libcuda"] = ctypes.CDLL("libcuda.so.1")
    driver = _state["libcuda"]
    rc = driver.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(length),
                                        ctypes.c_uint64(ptr))
    if rc != 0:
        raise ValueError(f"an output description naming no device memory (CUDA error {rc})")
    return base.value, length.value


def described_view(d, case):
    """The fields of an output description, checked (ValueError): the dtype and shape the oracle
    gives, a view inside its storage, and a reference-counter file of torch's own naming, the
    counter inside it (torch writes to it when the view is freed)."""
    if not isinstance(d, dict) or d.get("dtype") != str(case.out_dtype).replace("torch.", ""):
        raise ValueError("an output of the wrong dtype")
    shape, stride = [int(x) for x in d["shape"]], [int(x) for x in d["stride"]]
    if tuple(shape) != tuple(case.out_shape) or len(stride) != len(shape) \
            or min(stride, default=0) < 0:
        raise ValueError(f"an output of shape {shape}, expected {list(case.out_shape)}")
    offset, size, base = int(d["offset"]), int(d["size"]), int(d["storage_offset"])
    itemsize = torch.empty(0, dtype=case.out_dtype).element_size()
    extent = offset + sum((s - 1) * st for s, st in zip(shape, stride)) + 1
    counter, counter_at = base64.b64decode(d["ref_counter"]), int(d["ref_counter_offset"])
    name = counter.decode("ascii", "replace")
    path = f"{SHM}/{name[1:]}"
    if offset < 0 or base < 0 or extent * itemsize > size or not name.startswith("/torch_") \
            or "/" in name[1:] or not os.path.isfile(path) \
            or not 0 <= counter_at < os.path.getsize(path) // 8:
        raise ValueError("an output description out of bounds")
    return shape, stride, offset, size, base, counter, counter_at


def changed_set(case, sets, seeds):
    """The index of the first set that is no longer what its seed makes, or None."""
    for i, (held, seed) in enumerate(zip(sets, seeds)):
        if not unchanged(held, case.make(seed)):
            return i
    return None


def wrong_outputs(case, sets, outputs):
    """Every window output against the oracle of its set: {runner name: why it is wrong}."""
    wrong = {}
    for i, held in enumerate(sets):
        ref = case.reference(held)
        for name, outs in outputs.items():
            if name not in wrong and case.wrong(outs[i], ref, held):
                wrong[name] = f"the output of window call {i} of {len(sets)} differs from the " \
                              f"oracle"
    return wrong


def unchanged(inputs, pristine):
    return all(torch.equal(bits(t), bits(pristine[k])) for k, t in tensors(inputs).items())


def crosscheck(claimed_us, judged_us, who="the kernel's process"):
    """None when the judge's clock agrees with the report, else the reason to refuse it."""
    if judged_us <= CROSSCHECK_RATIO * claimed_us + CROSSCHECK_SLACK_US:
        return None
    return (f"timing contradicted: {who} reported {claimed_us:.1f} us per call, the judge's "
            f"clock measured {judged_us:.1f} us (over {CROSSCHECK_RATIO:g}x + "
            f"{CROSSCHECK_SLACK_US:g} us): timed differently from how it ran")


_state = {}  # once a process: the flush buffer, the window floor, the CUDA driver


def flush_l2():
    """Evict the L2 cache from this process (the cache is the GPU's, shared by every process)."""
    if ak.CUDA:
        if "buf" not in _state:
            _state["buf"] = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
        _state["buf"].zero_()
        torch.cuda.synchronize()


def median(values):
    return statistics.median(values) if values else None
