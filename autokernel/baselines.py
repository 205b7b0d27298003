"""
What this device can do and what PyTorch takes: the GPU's identity, its measured ceilings, and
the baseline times of each kernel type (eager, torch.compile, the library op), measured once and
cached in workspace/prepare.json. This module is that file's one reader and writer; prepare.py is
its CLI, bench.py's child and bench_starters.py read it through load_ceilings / baseline_times.

What it measures (CUDA): device-to-device copy GB/s (bytes read + written), dense matmul TFLOP/s
for fp16 and bf16 (8192^3) and fp32 (4096^3, TF32 off), and per kernel type and shape: eager
PyTorch (reference.<type>_eager), torch.compile(mode="max-autotune-no-cudagraphs", static
shapes) of that function, and the library baseline (reference.LIBRARY) where one exists. The
baselines are timed on the judge's clock, as bench.py times a kernel (autokernel/timing.py:
windows of fresh input sets, L2 flushed, replayed as one CUDA graph, which stands in for
max-autotune's own graphs), so "vs eager" and "vs compile" compare like with like; the ceilings
(and bench_starters.py's table) are triton.testing.do_bench medians with L2 flushed. Without CUDA
it records the CPU, no ceilings, and CPU eager times at tiny shapes, which are NOT meaningful
for GPU kernels.

prepare.json, rebuilt when the key no longer matches:
{
  "schema": 1,
  "key": "NVIDIA H100 80GB HBM3|132 SMs|cc 9.0|81559 MiB|torch 2.11.0|triton 3.6.0"
         (or "cpu|<model>|torch ...|triton ..."): another GPU or torch/triton invalidates the cache,
  "device": {"name", "cuda", "sm_count", "capability": [9, 0], "memory_mib", "max_sm_clock_mhz",
             "max_mem_clock_mhz", "driver", "torch", "triton"}
            (CPU: "name": "cpu", "cuda": false, "cpu_model", "cores", "torch", "triton"),
  "spec": {"name", "fp16_tflops", "bandwidth_gb_s", "source"}  datasheet, autokernel.gpus (CPU:
          Nones),
  "ceilings": {"bandwidth_gb_s": float|None, "tflops": {"fp16", "bf16", "fp32"}|None,
               "measured_at": iso},
  "baselines": {"<type>|<shape, e.g. 8192x8192>|<fp16|bf16|fp32>": {
       "kernel_type", "shape": [..], "dtype", "eager_us", "compile_us", "compile_mode",
       "compile_s" (compile wall time), "library", "library_us", "measured_at",
       "<what>_error": one line when eager/compile/library failed (that time is then null; not
       retried until --force), "compile_note": "skipped on CPU"}},
  "timing_meaningful": bool, "updated": iso
}

API:
    load_ceilings() -> {"gpu", "bandwidth_gb_s", "tflops", "spec", "timing_meaningful"}; reads only.
    roofline_ceilings(dtype) -> {"tflops", "bandwidth_gb_s", "source"}: measured, else datasheet.
    baseline_times(ktype, shape, dtype) -> {"eager_us", "compile_us", "library_us", "library"};
        cached, or measured once and cached (compile only on CUDA).
    ensure_ceilings(): load_ceilings, measuring first when missing (prepare.py, bench_starters).
    time_us(fn), compile_and_time(fn, inputs, mode): the shared timing helpers.
"""
import contextlib
import datetime
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import autokernel.kernel_types  # noqa: F401  (first: CPU mode is set before triton is imported)

import torch

from autokernel import CUDA, DEVICE, KERNEL_TYPES, KernelType, reference
from autokernel.cli import describe
from autokernel.gpus import gpu_spec
from autokernel.workspace import write_json

SCHEMA = 2                             # 2: baselines on the judge's clock (1: do_bench)
CACHE_PATH = autokernel.PREPARE_JSON   # read at call time, so tests can point it elsewhere
COMPILE_MODE = "max-autotune-no-cudagraphs"  # the judge's clock replays it in a CUDA graph
BASELINE_DTYPE = torch.float16         # the dtype prepare.py measures and reports
COPY_BYTES = 1 << 30                   # 1 GiB: far beyond any L2, so copy speed is HBM speed
MATMUL_SIZES = {"fp16": 8192, "bf16": 8192, "fp32": 4096}
_warned = set()


def warn(message):
    """One line on stderr, once per process (a corrupt cache is read by every call)."""
    if message not in _warned:
        _warned.add(message)
        print(f"prepare: {message}", file=sys.stderr, flush=True)


def now():
    return datetime.datetime.now().isoformat(timespec="seconds")


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# ---------------------------------------------------------------------------------------------
# The device
# ---------------------------------------------------------------------------------------------

def _cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine() or "unknown CPU"


def _nvidia_smi(props):
    """Clocks and driver from nvidia-smi for the GPU torch sees as device 0; {} when unavailable.
    Selected by UUID (CUDA_VISIBLE_DEVICES renumbers devices, not UUIDs), else by name."""
    fields = "name,clocks.max.sm,clocks.max.memory,driver_version"
    uuid = str(getattr(props, "uuid", "") or "")
    selectors = [["-i", uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"]] if uuid else []
    for selector in selectors + [[]]:
        try:
            out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}",
                                  "--format=csv,noheader,nounits", *selector],
                                 capture_output=True, text=True, timeout=15)
        except (OSError, subprocess.SubprocessError):
            return {}  # no nvidia-smi at all
        lines = out.stdout.strip().splitlines() if out.returncode == 0 else []
        for line in lines:
            parts = [part.strip() for part in line.split(",")]
            if len(parts) != 4 or (not selector and parts[0] != props.name):
                continue
            as_int = lambda v: int(float(v)) if v.replace(".", "", 1).isdigit() else None
            return {"max_sm_clock_mhz": as_int(parts[1]), "max_mem_clock_mhz": as_int(parts[2]),
                    "driver": parts[3]}
    return {}


def device_identity():
    """The cheap facts (no subprocess) that key the cache."""
    versions = {"torch": torch.__version__, "triton": _version("triton")}
    if not CUDA:
        return {"name": "cpu", "cuda": False, "cpu_model": _cpu_model(),
                "cores": os.cpu_count(), **versions}
    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "cuda": True, "sm_count": props.multi_processor_count,
            "capability": [props.major, props.minor], "memory_mib": props.total_memory >> 20,
            **versions}


def cache_key(identity):
    versions = f"torch {identity['torch']}|triton {identity['triton']}"
    if not identity["cuda"]:
        return f"cpu|{identity['cpu_model']}|{versions}"
    major, minor = identity["capability"]
    return (f"{identity['name']}|{identity['sm_count']} SMs|cc {major}.{minor}|"
            f"{identity['memory_mib']} MiB|{versions}")


def detect_device():
    """Everything we know about the device: identity plus clocks and driver (nvidia-smi, with
    Triton's driver query as the fallback for the SM clock)."""
    device = device_identity()
    if not CUDA:
        return device
    props = torch.cuda.get_device_properties(0)
    device.update({"max_sm_clock_mhz": None, "max_mem_clock_mhz": None, "driver": None})
    device.update(_nvidia_smi(props))
    if device["max_sm_clock_mhz"] is None:
        try:
            import triton
            khz = triton.runtime.driver.active.utils.get_device_properties(0)["sm_clock_rate"]
            device["max_sm_clock_mhz"] = khz // 1000
        except Exception:  # noqa: BLE001  (only a nicety: the spec estimate needs it)
            pass
    return device


def spec_for(device):
    """Datasheet numbers (autokernel.gpus), Nones on a CPU."""
    if not device["cuda"]:
        return {"name": "cpu", "fp16_tflops": None, "bandwidth_gb_s": None, "source": None}
    spec = gpu_spec(device["name"], device["sm_count"],
                               device.get("max_sm_clock_mhz") or 0.0, tuple(device["capability"]))
    return {"name": spec.name, "fp16_tflops": spec.fp16_tflops,
            "bandwidth_gb_s": spec.bandwidth_gb_s or None, "source": spec.source}


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------

def time_us(fn, warmup_ms=25, rep_ms=100):
    """Median runtime of fn() in microseconds. CUDA: triton.testing.do_bench, which flushes L2
    before every call. CPU: a few wall-clock runs (they rank nothing on a GPU)."""
    if CUDA:
        import triton.testing
        return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e3
    fn()
    times, deadline = [], time.perf_counter() + rep_ms / 1e3
    while len(times) < 3 or (len(times) < 20 and time.perf_counter() < deadline):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def _sync():
    if CUDA:
        torch.cuda.synchronize()


def compile_and_time(fn, inputs, mode=COMPILE_MODE, case=None):
    """torch.compile(fn) with static shapes, compile it on `inputs`, time it (on the judge's
    clock when given the timing.Case of the inputs, else do_bench).
    Returns (us, compile_seconds, error): a failed compile is reported, never raised.

    For do_bench the inputs are marked static: with CUDA graphs (mode "max-autotune") inductor
    otherwise copies every non-static input into the graph's buffers on each call, a cost the op
    does not have inside a compiled model (its input is already there), which would flatter our
    kernels. The judge's clock feeds fresh input sets, so there they are not."""
    try:
        torch._dynamo.reset()  # fresh caches: no recompile limit, no dynamic-shape guesswork
        for value in inputs.values():  # tensors only: eps, causal, dim are Python constants
            if isinstance(value, torch.Tensor) and case is None:
                torch._dynamo.mark_static_address(value)
        compiled = torch.compile(fn, mode=mode, dynamic=False)
        start = time.perf_counter()
        compiled(**inputs)
        _sync()
        compile_s = time.perf_counter() - start
        return clock_us(compiled, inputs, case), compile_s, None
    except Exception as exc:  # noqa: BLE001  (inductor raises anything; the row records it)
        return None, None, describe(exc)


def clock_us(fn, inputs, case=None):
    """fn's time on the judge's clock (timing.trusted_window_us) when given a timing.Case on a
    GPU, else its do_bench median on these inputs."""
    us = time_us(lambda: fn(**inputs))
    if case is None or not CUDA:
        return us
    from autokernel import timing
    return timing.trusted_window_us(fn, case, us)


def eager_function(ktype):
    """What a model runs today: reference.<type>_eager (a plain function, so torch.compile can
    trace it)."""
    return getattr(reference, f"{ktype.name}_eager")


# ---------------------------------------------------------------------------------------------
# Ceilings
# ---------------------------------------------------------------------------------------------

@contextlib.contextmanager
def full_fp32():
    """fp32 means fp32: no TF32 in matmuls (torch's precision "highest") nor in cuDNN's
    convolutions (TF32 by torch's default), both restored after."""
    precision, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(precision)
        torch.backends.cudnn.allow_tf32 = cudnn


def measure_ceilings(log=print):
    """Copy GB/s and dense matmul TFLOP/s on this GPU (None on a CPU)."""
    if not CUDA:
        return {"bandwidth_gb_s": None, "tflops": None, "measured_at": now()}
    free, _ = torch.cuda.mem_get_info()
    nbytes = min(COPY_BYTES, free // 8) // 4 * 4
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    copy_us = time_us(lambda: dst.copy_(src))
    bandwidth = 2 * nbytes / (copy_us * 1e-6) / 1e9  # read + write
    log(f"  copy {nbytes >> 20} MiB: {copy_us:.1f} us -> {bandwidth:,.0f} GB/s")
    del src, dst
    tflops = {}
    with full_fp32():
        for name, n in MATMUL_SIZES.items():
            a, b = (torch.randn(n, n, device="cuda", dtype=autokernel.DTYPES[name])
                    for _ in range(2))
            out = torch.empty_like(a)
            us = time_us(lambda: torch.matmul(a, b, out=out))
            tflops[name] = 2 * n ** 3 / (us * 1e-6) / 1e12
            log(f"  matmul {name} {n}^3: {us:.1f} us -> {tflops[name]:,.1f} TFLOP/s")
            del a, b, out
    torch.cuda.empty_cache()
    return {"bandwidth_gb_s": bandwidth, "tflops": tflops, "measured_at": now()}


# ---------------------------------------------------------------------------------------------
# Baselines
# ---------------------------------------------------------------------------------------------

def _as_ktype(ktype):
    return ktype if isinstance(ktype, KernelType) else autokernel.kernel_type(ktype)


def _as_dtype(dtype):
    return dtype if isinstance(dtype, torch.dtype) else autokernel.parse_dtype(dtype)


def baseline_key(ktype, shape, dtype, variant=None):
    """type|shape|dtype, and the variant's options when it is not the default one."""
    options = "".join(f"|{k}={v}" for k, v in sorted((variant or {}).items()))
    return f"{ktype.name}|{ktype.shape_str(shape)}|{autokernel.DTYPE_NAMES[dtype]}{options}"


def _is_time(value):
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _missing(ktype, entry, compile_mode):
    """Which of eager / library / compile this cache entry still lacks."""
    want = []
    if "eager_us" not in entry or not _is_time(entry["eager_us"]):
        want.append("eager")
    if ktype.name in reference.LIBRARY and ("library_us" not in entry
                                            or not _is_time(entry["library_us"])):
        want.append("library")
    if "compile_us" not in entry or not _is_time(entry["compile_us"]):
        if not CUDA:
            entry.update(compile_us=None, compile_note="skipped on CPU")
        elif compile_mode:
            want.append("compile")
    return want


def measure_baselines(ktype, shape, dtype, want=("eager", "library", "compile"),
                      compile_mode=COMPILE_MODE, log=print, variant=None):
    """Time the wanted baselines at one shape (and variant); returns the fields to cache."""
    label = f"{ktype.name} {ktype.shape_str(shape)} {autokernel.DTYPE_NAMES[dtype]}"
    fields = {"kernel_type": ktype.name, "shape": list(shape),
              "dtype": autokernel.DTYPE_NAMES[dtype], "variant": variant or {},
              "measured_at": now()}
    try:
        inputs = ktype.inputs(shape, dtype, DEVICE, variant=variant)
        case = None
        if CUDA:
            from autokernel import timing
            case = timing.kernel_case(ktype, tuple(shape), dtype, variant)
    except Exception as exc:  # noqa: BLE001  (e.g. out of memory at a model's shape)
        for what in want:
            fields.update({f"{what}_us": None, f"{what}_error": describe(exc)})
        return fields
    for what in want:
        if what == "compile":
            log(f"  {label}: torch.compile(mode={compile_mode!r}) ...")
        times, error = time_baseline(ktype, what, inputs, compile_mode, case)
        fields.update(times)
        if error:
            fields[f"{what}_error"] = error
            log(f"  {label}: {what} failed: {error}")
        else:
            fields.pop(f"{what}_error", None)
            log(f"  {label}: {what} {fields[f'{what}_us']:.1f} us")
    del inputs, case
    if CUDA:
        torch.cuda.empty_cache()
    return fields


def time_baseline(ktype, what, inputs, compile_mode=COMPILE_MODE, case=None):
    """Time one baseline, "eager", "library" or "compile", on these inputs (on the judge's clock
    when given their timing.Case, else do_bench). Returns (the fields to record: "<what>_us" and
    "library" or "compile_mode"/"compile_s", the error as one line or None): a failure is
    recorded, never raised."""
    if what == "compile":
        us, seconds, error = compile_and_time(eager_function(ktype), inputs, compile_mode, case)
        return {"compile_us": us, "compile_mode": compile_mode, "compile_s": seconds}, error
    fields, fn = {}, eager_function(ktype)
    if what == "library":
        fields["library"], fn = reference.LIBRARY[ktype.name]
    try:
        fn(**inputs)
        _sync()
        fields[f"{what}_us"] = clock_us(fn, inputs, case)
        return fields, None
    except Exception as exc:  # noqa: BLE001  (out of memory at a model's shape, say)
        fields[f"{what}_us"] = None
        return fields, describe(exc)


# ---------------------------------------------------------------------------------------------
# The cache file
# ---------------------------------------------------------------------------------------------

def _fresh_cache(identity):
    return {"schema": SCHEMA, "key": cache_key(identity), "device": identity,
            "spec": spec_for(identity), "ceilings": {"bandwidth_gb_s": None, "tflops": None},
            "baselines": {}, "timing_meaningful": autokernel.TIMING_MEANINGFUL, "updated": now()}


def read_cache(identity=None):
    """The cache when it exists, is well formed and belongs to this device; else a fresh one.
    A corrupt file gets a one-line warning and is rebuilt on the next write."""
    identity = identity or device_identity()
    path = Path(CACHE_PATH)
    if not path.exists():
        return _fresh_cache(identity)
    try:
        cache = json.loads(path.read_text())
        if not (isinstance(cache, dict) and cache.get("schema") == SCHEMA
                and isinstance(cache.get("baselines"), dict)
                and isinstance(cache.get("ceilings"), dict)
                and isinstance(cache.get("spec"), dict)):
            raise ValueError("unexpected layout")
    except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
        warn(f"{path} is corrupt ({describe(exc)}); rebuilding it")
        return _fresh_cache(identity)
    if cache.get("key") != cache_key(identity):
        warn(f"{path} belongs to {cache.get('key')!r}, not this device; ignoring it")
        return _fresh_cache(identity)
    return cache


def update_cache(change):
    """Read, change(cache), write atomically, under a lock so that concurrent writers (two
    bench.py runs measuring baselines) merge instead of overwriting each other."""
    path = Path(CACHE_PATH)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        try:
            import fcntl
            fcntl.flock(lock, fcntl.LOCK_EX)
        except ImportError:  # not POSIX: no lock, the atomic replace still avoids torn files
            pass
        cache = read_cache()
        change(cache)
        cache["updated"] = now()
        write_json(path, cache, indent=2)
    return cache


# ---------------------------------------------------------------------------------------------
# What the scripts read
# ---------------------------------------------------------------------------------------------

def load_ceilings():
    """Measured ceilings from the cache (never measures). Nones on a CPU or before prepare.py
    has run on this GPU; the datasheet spec is always filled in (Nones on a CPU)."""
    identity = device_identity()
    cache = read_cache(identity)
    ceilings = cache["ceilings"]
    tflops = ceilings.get("tflops")
    return {"gpu": identity["name"],
            "bandwidth_gb_s": ceilings.get("bandwidth_gb_s"),
            "tflops": dict(tflops) if isinstance(tflops, dict) else None,
            "spec": dict(cache["spec"]),
            "timing_meaningful": autokernel.TIMING_MEANINGFUL}


def roofline_ceilings(dtype):
    """The ceilings to draw a roofline against for one dtype: prepare.py's measurements on this
    GPU when present, else the datasheet's; None on a CPU or for an unknown GPU unmeasured."""
    if not CUDA:
        return None
    ceilings = load_ceilings()
    tflops = ceilings["tflops"] or {}
    rate = tflops.get(autokernel.DTYPE_NAMES[_as_dtype(dtype)]) or tflops.get("fp16")
    if rate and ceilings["bandwidth_gb_s"]:
        return {"tflops": float(rate), "bandwidth_gb_s": float(ceilings["bandwidth_gb_s"]),
                "source": f"measured by prepare.py ({Path(CACHE_PATH).name})"}
    spec = ceilings["spec"]
    if not spec.get("bandwidth_gb_s"):
        return None
    return {"tflops": spec["fp16_tflops"], "bandwidth_gb_s": spec["bandwidth_gb_s"],
            "source": f"datasheet ({spec['name']}; run prepare.py to measure)"}


def ensure_ceilings(force=False, log=print):
    """The measured ceilings, measuring (and caching) them first when missing."""
    ceilings = load_ceilings()
    if CUDA and (force or ceilings["bandwidth_gb_s"] is None or not ceilings["tflops"]):
        log("measuring this GPU's ceilings ...")
        measured = measure_ceilings(log)
        device = detect_device()
        update_cache(lambda cache: cache.update(ceilings=measured, device=device,
                                                spec=spec_for(device)))
        ceilings = load_ceilings()
    return ceilings


def baseline_times(ktype, shape, dtype, *, compile=True, compile_mode=COMPILE_MODE, force=False,
                   log=None, variant=None):
    """{"eager_us", "compile_us", "library_us", "library"} for one type, shape, dtype (a
    KernelType or name; torch dtype or "fp16") and variant of its contract (None: the default).
    Cached values come back at once; missing ones are
    measured once and cached (a failure is cached as None with its error, not retried). compile:
    False skips measuring torch.compile (the cached value, if any, is still returned)."""
    ktype, dtype = _as_ktype(ktype), _as_dtype(dtype)
    shape = tuple(int(d) for d in shape)
    key = baseline_key(ktype, shape, dtype, variant)
    entry = {} if force else dict(read_cache()["baselines"].get(key, {}))
    want = _missing(ktype, entry, compile_mode if compile else None)
    if want:
        for what in want:  # a re-measurement replaces an old failure
            entry.pop(f"{what}_error", None)
        log = log or (lambda message: print(f"prepare:{message}", file=sys.stderr, flush=True))
        entry.update(measure_baselines(ktype, shape, dtype, want, compile_mode, log, variant))
        update_cache(lambda cache: cache["baselines"].__setitem__(key, entry))
    return {"eager_us": entry.get("eager_us"), "compile_us": entry.get("compile_us"),
            "library_us": entry.get("library_us"), "library": entry.get("library")}


def parse_types(text):
    """Kernel type names from a comma-separated --types flag (all of them when empty); a
    ValueError names an unknown one."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        autokernel.kernel_type(name)
    return names or list(KERNEL_TYPES)
