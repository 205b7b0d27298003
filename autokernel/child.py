"""
The untrusted side of the gate: a process that imports one kernel file and runs its kernel_fn on
the inputs the judge sends, nothing more. It decides nothing.

bench.py's judge starts it (multiprocessing, spawn) and drives it over a pipe. The judge sends
the inputs and output buffers (CUDA IPC on a GPU, shared memory on a CPU); this process copies
kernel_fn's result into a buffer, or describes where a CUDA graph's outputs are for the judge to
open, and answers in JSON, never in pickle (unpickling a message from here would run code in the
judge):
    ("call", inputs, poison, buffer)  -> {"status": "ok", "shape", "dtype", "aliases", "copied"}
                                         | {"status": "forbidden", "op"}
                                         | {"status": "raised", "kind", "error"}
    ("time", inputs, buffer)          -> {"status": "timed", "median_us", ...}: the median of
                                         one call; the buffer gets a timed call's output
    ("arm", sets, slots)              -> {"status": "armed", "graph", "outputs", "note"}:
                                         holds the judge's input sets and output slots for the
                                         windows, warms up on them and captures one call on each
                                         in a CUDA graph when it can (its outputs described for
                                         the judge's CUDA IPC)
    ("window",)                       -> {"status": "windowed"}: one call on each held set (the
                                         graph replayed, else each output copied into its slot),
                                         a device sync; the judge times this request with its
                                         own clock and then reads every output
    ("build", init_args, seed, dtype, library)
                                      -> {"status": "built"} | {"status": "raised", ...}: a
                                         KernelBench kernel file's ModelNew(*init_args), built
                                         under the judge's seed (autokernel/kernelbench.py);
                                         its forward is the kernel_fn of the calls after it,
                                         which may call the aten ops in `library` (a region's
                                         GEMMs and convolutions): each call's reply counts them
    ("stop",)

Before the kernel file is imported this process confines itself (autokernel/sandbox.py): it
writes only its scratch directory and /dev, cannot read the judge's private directory nor signal
the judge. Within it, what runs here can patch anything in this process (its clocks, json,
torch, these functions), so the checks below are a courtesy that names the usual mistakes
early: a torch compute op called from kernel_fn (rejected by a dispatch guard), outputs
allocated inside kernel_fn (poisoned, so unwritten elements show) and outputs that alias an
input. Everything a verdict rests on (values,
shapes, inputs left unmodified, determinism, latency) is judged by the judge.
"""
import base64
import ctypes
import faulthandler
import gc
import json
import os
import signal
import sys
import time
import traceback

PR_SET_PDEATHSIG = 1

# Ops kernel_fn may call: allocate and initialise outputs, views and metadata. Everything else in
# aten/prims is math that must happen in the kernel's own Triton code.
ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
               "empty_permuted"}
ALLOWED_OPS = ALLOCATIONS | {
    "zeros", "zeros_like", "new_zeros", "full", "full_like", "new_full", "fill_", "zero_",
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "expand", "t",
    "transpose", "permute", "squeeze", "unsqueeze", "select", "slice", "alias", "detach",
    "unbind", "split", "split_with_sizes", "chunk", "narrow", "unflatten", "view_as",
    "expand_as", "unfold", "lift_fresh", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
    "size", "stride", "dim", "numel", "storage_offset", "is_contiguous", "is_same_size",
    "is_non_overlapping_and_dense", "_local_scalar_dense", "record_stream",
}


def serve(conn, kernel_path, log_path, source=None, confinement=None):
    """The child's main: detach, confine itself (confinement: autokernel/sandbox.prepare's),
    import the kernel (source: its text, handed over in memory), answer the judge until told
    to stop."""
    os.setsid()  # own process group: the judge kills the whole group
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)  # the kernel's prints and faulthandler's reports go to the child log,
    os.dup2(log, 2)  # never to bench.py's stdout, where the verdict is
    sys.stdout = sys.stderr = open(2, "w", buffering=1, closefd=False)
    if sys.platform.startswith("linux"):  # die with the judge (a kernel can undo this: see docs)
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    faulthandler.enable()  # a segfault or abort leaves a Python traceback in the log
    send = lambda msg: conn.send_bytes(json.dumps(msg).encode())  # noqa: E731
    from autokernel import sandbox
    import autokernel.kernel_types  # noqa: F401  (CPU mode: TRITON_INTERPRET before triton)
    import torch
    if torch.cuda.is_available():
        # The driver's first use opens its device files and may run nvidia-modprobe (setuid)
        # to make them: the sandbox's no-new-privileges and write rules would refuse that
        # ("cudaGetDeviceCount ... Error 304"), so the GPU is set up first, by the judge's code.
        torch.zeros(1, device="cuda")
    try:
        if confinement is not None:  # before any of the kernel's code runs
            sandbox.confine(confinement)
    except sandbox.SandboxError as e:
        send({"status": "import_failed", "error": f"the sandbox could not confine the kernel's "
                                                  f"process ({e}); AUTOKERNEL_SANDBOX=off judges "
                                                  f"it unconfined"})
        return
    confined = confinement is not None and confinement["abi"] is not None
    from autokernel.contract import load_module, module_attrs
    try:
        module = load_module(kernel_path, source=source)
    except BaseException as e:  # noqa: B036  (SystemExit from a kernel file is a failure too)
        traceback.print_exc()
        from autokernel.cuda_build import CudaBuildError
        kind = CudaBuildError.kind if isinstance(e, CudaBuildError) else \
            "import error" if isinstance(e, ImportError) else \
            "the sandbox refused it" if confined and isinstance(e, PermissionError) else \
            f"{type(e).__name__} while importing the kernel file"
        send({"status": "import_failed", "error": f"{kind}: {_line(e)}"})
        return
    attrs = {k: v for k, v in module_attrs(module).items() if _plain(v)}
    runner = Runner(getattr(module, "kernel_fn", None), getattr(module, "ModelNew", None))
    send({"status": "loaded", "attrs": attrs, "has_kernel_fn": callable(runner.fn),
          "has_model_new": isinstance(runner.model_class, type)})
    while True:
        if runner.sets is not None and runner.cuda:  # armed: wake at once for the next window
            while not conn.poll(0):
                pass
        msg = conn.recv()
        if msg[0] == "stop":
            break
        send({"status": "pong"} if msg[0] == "ping" else getattr(runner, msg[0])(*msg[1:]))
    # Release the judge's shared tensors (CUDA IPC counts their users), then go without the
    # interpreter's teardown: nothing is left to flush, and unloading torch takes ~0.3 s, which
    # the judge waits out for every child.
    del runner
    gc.collect()
    sys.stdout.flush()
    os._exit(0)


class Runner:
    """Runs kernel_fn for the judge and answers in plain dicts. The tests call it in-process."""

    def __init__(self, fn, model_class=None):
        import torch
        import autokernel
        self.torch, self.fn, self.cuda = torch, fn, autokernel.CUDA
        self.model_class = model_class  # a KernelBench file's ModelNew (fn comes from build)
        self.Guard = make_guard()
        self.sets = self.slots = self.graph = self.outs = None  # the timing's windows
        self.previous = None  # the last call's output: one reused for new inputs is a cache
        self.library = frozenset()  # aten ops the guard lets through (and counts)

    def build(self, init_args, seed, dtype, library=()):
        """ModelNew(*init_args) as KernelBench builds it: on the CPU under the judge's seed (the
        judge builds the problem's Model the same way, so parameters created in the same order
        match), then moved to the device and dtype. Its forward, given the inputs in order and
        without autograd, becomes what call, time and loop run. Outside the guard: building
        initialises parameters with torch ops."""
        torch = self.torch
        if not isinstance(self.model_class, type):
            return {"status": "raised", "kind": "error",
                    "error": "the kernel file defines no ModelNew class"}
        try:
            with torch.no_grad():
                torch.manual_seed(seed)
                model = self.model_class(*init_args).to(device="cuda" if self.cuda else "cpu",
                                                        dtype=getattr(torch, dtype))
        except BaseException as e:  # noqa: B036  (SystemExit from ModelNew is a failure too)
            if isinstance(e, KeyboardInterrupt):
                raise
            return self.raised(e)

        def forward(**inputs):
            with torch.no_grad():
                return model(*inputs.values())
        self.fn, self.previous, self.library = forward, None, frozenset(library)
        if library:  # the libraries' fp32 is fp32, as the judge's references are (no TF32:
            torch.backends.cudnn.allow_tf32 = False  # baselines.full_fp32)
            torch.set_float32_matmul_precision("highest")
        return {"status": "built"}

    def call(self, inputs, poison, buffer):
        guard = self.Guard(poison, self.library)
        try:
            with guard:
                out = self.fn(**inputs)
            self.sync()
        except ForbiddenOp:
            pass
        except BaseException as e:  # noqa: B036  (SystemExit from kernel_fn is a failure too)
            if isinstance(e, KeyboardInterrupt):
                raise
            if guard.violation is None:
                return self.raised(e)
        if guard.violation:
            return {"status": "forbidden", "op": guard.violation}
        reused = self.previous is not None and isinstance(out, self.torch.Tensor) \
            and overlaps(out, self.previous)
        self.previous = out
        reply = dict(self.deliver(out, inputs, buffer), reused=reused)
        if guard.library_calls:
            reply["library"] = dict(guard.library_calls)
        if self.cuda:  # the judge's oracle shares the GPU: hand back what this call freed
            self.torch.cuda.empty_cache()
        return reply

    def time(self, inputs, buffer):
        """Median time of one call (the judge cross-checks it with its own clock)."""
        fn = lambda: self.fn(**inputs)  # noqa: E731  (no guard: it would cost time)
        try:
            if self.cuda:
                import triton.testing
                median_us = triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3
                out = fn()
                self.sync()
            else:  # the interpreter: one wall-clock call a round, labelled meaningless
                start = time.perf_counter()
                out = fn()
                median_us = (time.perf_counter() - start) * 1e6
        except Exception as e:
            return self.raised(e)
        peak = self.torch.cuda.max_memory_allocated() / 2 ** 20 if self.cuda else None
        return dict(self.deliver(out, inputs, buffer), status="timed", median_us=median_us,
                    peak_vram_mb=peak)

    def arm(self, sets, slots):
        """Hold the windows' input sets (the judge rewrites their values before each window),
        warm up on them and, without slots, capture one call on each in a CUDA graph: a graph
        replays without launch overhead, as a model under CUDA graphs does, and its outputs stay
        where they are, so they are described for the judge once, here. With slots (a CPU, or
        the judge's second try when capturing failed) each window copies its outputs there."""
        torch = self.torch
        self.sets, self.slots, self.graph, self.outs = sets, slots, None, None
        try:
            for inputs in sets[:2]:
                self.fn(**inputs)
            self.sync()
        except Exception as e:
            return self.raised(e)
        note, described = "", None
        if self.cuda and slots is None:
            try:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    outs = [self.fn(**inputs) for inputs in sets]
                described = [shared(out) for out in outs]
                self.graph, self.outs = graph, outs
            except Exception as e:  # not capturable (a host sync, say): plain launches then
                traceback.print_exc()
                note = f"not captured in a CUDA graph ({type(e).__name__}: {_line(e)})"
                self.sync()
        return {"status": "armed", "graph": self.graph is not None, "outputs": described,
                "note": note}

    def window(self):
        """One call on each held set, then a device sync: the graph's replay (its outputs are
        where arm described them), else plain calls, each output copied into its slot."""
        try:
            if self.graph is not None:
                self.graph.replay()
            else:
                for inputs, slot in zip(self.sets, self.slots):
                    slot.copy_(self.fn(**inputs))
            self.sync()
        except Exception as e:
            return self.raised(e)
        return {"status": "windowed"}

    def deliver(self, out, inputs, buffer):
        """Describe the output and copy it into the judge's buffer when it fits."""
        torch = self.torch
        if not isinstance(out, torch.Tensor):
            return {"status": "ok", "type": type(out).__name__}
        aliases = [name for name, t in inputs.items()
                   if isinstance(t, torch.Tensor) and (out is t or overlaps(out, t))]
        copied = tuple(out.shape) == tuple(buffer.shape) and out.dtype == buffer.dtype \
            and out.device == buffer.device
        if copied:
            buffer.copy_(out)
            self.sync()
        return {"status": "ok", "type": "Tensor", "shape": list(out.shape),
                "dtype": str(out.dtype).replace("torch.", ""), "device": str(out.device),
                "aliases": aliases, "copied": copied}

    def raised(self, e):
        traceback.print_exc()
        return {"status": "raised", "kind": error_kind(self.torch, e),
                "error": f"{type(e).__name__}: {_line(e)}"}

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()  # surfaces asynchronous device errors here


def shared(t):
    """A CUDA tensor described for the judge's CUDA IPC (what torch.multiprocessing sends, as
    plain JSON: the judge never unpickles anything from this process)."""
    (device, handle, size, storage_offset, counter, counter_offset, _, _) = \
        t.untyped_storage()._share_cuda_()
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
            "stride": list(t.stride()), "offset": t.storage_offset(), "device": device,
            "handle": b64(handle), "size": size, "storage_offset": storage_offset,
            "ref_counter": b64(counter), "ref_counter_offset": counter_offset}


def overlaps(a, b):
    """True when two tensors' storages share any byte."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    sa, sb = a.untyped_storage(), b.untyped_storage()
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes()


class ForbiddenOp(Exception):
    pass


def make_guard():
    """A TorchDispatchMode that rejects torch compute ops and poisons fresh allocations."""
    import torch
    import triton
    from torch.utils._python_dispatch import TorchDispatchMode
    triton_dir = os.path.dirname(triton.__file__) + os.sep

    def from_triton():
        # Triton's interpreter and autotuner issue torch ops themselves (host copies, do_bench).
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_filename.startswith(triton_dir):
                return True
            frame = frame.f_back
        return False

    class Guard(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):
            # Otherwise torch wraps __torch_dispatch__ in torch._dynamo.disable, and the first
            # call imports all of dynamo (~900 modules, seconds). Nothing here is compiled.
            return False

        def __init__(self, poison, library=frozenset()):
            super().__init__()
            self.poison, self.violation, self.library = poison, None, library
            self.library_calls = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in self.library and func.namespace == "aten":
                self.library_calls[name] = self.library_calls.get(name, 0) + 1
            elif func.namespace in ("aten", "prims") and name not in ALLOWED_OPS \
                    and not from_triton():
                # Remember it: a kernel that swallows the exception is still caught.
                self.violation = self.violation or f"{func.namespace}.{name}"
                raise ForbiddenOp(self.violation)
            out = func(*args, **(kwargs or {}))
            if name in ALLOCATIONS and isinstance(out, torch.Tensor) and out.is_floating_point():
                out.fill_(self.poison)  # unwritten elements will show
            return out

    return Guard


def error_kind(torch, e):
    """'oom', 'device' (the device is gone: nothing more can run in this process) or 'error'."""
    text = str(e).lower()
    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                  getattr(torch.cuda, "OutOfMemoryError", None), MemoryError) if t)
    if isinstance(e, oom_types) or "out of memory" in text or "can't allocate memory" in text:
        return "oom"
    if any(s in text for s in ("illegal memory access", "device-side assert",
                               "unspecified launch failure", "illegal instruction",
                               "misaligned address", "cuda error")):
        return "device"
    return "error"


def _line(e):
    from autokernel.cli import one_line
    return one_line(e)


def _plain(value):
    """Literal values only cross to the judge (a kernel module can hold anything)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return True
    return isinstance(value, (list, tuple)) and all(_plain(v) for v in value)
