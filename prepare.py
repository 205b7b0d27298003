"""
One-time setup: detect the GPU, measure its ceilings, time the PyTorch baselines. Cached.

    uv run prepare.py                          # detect, measure once, print the table
    uv run prepare.py --types softmax,matmul   # baselines for some types only
    uv run prepare.py --force                  # re-measure even what is cached
    uv run prepare.py --no-compile             # skip torch.compile (max-autotune takes minutes)

What it measures (CUDA): device-to-device copy GB/s (bytes read + written), dense matmul TFLOP/s
for fp16 and bf16 (8192^3) and fp32 (4096^3, TF32 off), and per kernel type at its primary shape in
fp16: eager PyTorch (reference.<type>_eager), torch.compile(mode="max-autotune") of that function,
and the library baseline (reference.LIBRARY) where one exists. All times are
triton.testing.do_bench medians with L2 flushed; compile runs with static shapes and its inputs
marked static (see compile_and_time). Without CUDA it records the CPU, no ceilings, and
CPU eager times at tiny shapes, which are NOT meaningful for GPU kernels.

Cache: autokernel.PREPARE_JSON (workspace/prepare.json), rebuilt when the key no longer matches:
{
  "schema": 1,
  "key": "NVIDIA H100 80GB HBM3|132 SMs|cc 9.0|81559 MiB|torch 2.11.0|triton 3.6.0"
         (or "cpu|<model>|torch ...|triton ..."): another GPU or torch/triton invalidates the cache,
  "device": {"name", "cuda", "sm_count", "capability": [9, 0], "memory_mib", "max_sm_clock_mhz",
             "max_mem_clock_mhz", "driver", "torch", "triton"}
            (CPU: "name": "cpu", "cuda": false, "cpu_model", "cores", "torch", "triton"),
  "spec": {"name", "fp16_tflops", "bandwidth_gb_s"}  datasheet, autokernel.gpu_spec (CPU: Nones),
  "ceilings": {"bandwidth_gb_s": float|None, "tflops": {"fp16", "bf16", "fp32"}|None,
               "measured_at": iso},
  "baselines": {"<type>|<shape, e.g. 8192x8192>|<fp16|bf16|fp32>": {
       "kernel_type", "shape": [..], "dtype", "eager_us", "compile_us", "compile_mode",
       "compile_s" (compile wall time), "library", "library_us", "measured_at",
       "<what>_error": one line when eager/compile/library failed (that time is then null; not
       retried until --force), "compile_note": "skipped on CPU"}},
  "timing_meaningful": bool, "updated": iso
}

Importable API (bench.py, bench_starters.py):
    load_ceilings() -> {"gpu", "bandwidth_gb_s", "tflops", "spec", "timing_meaningful"}; reads only.
    baseline_times(ktype, shape, dtype) -> {"eager_us", "compile_us", "library_us", "library"};
        cached, or measured once and cached (compile only on CUDA).
    time_us(fn), compile_and_time(fn, inputs, mode): the shared timing helpers.
"""
import autokernel  # first: loads the stdlib `profile` before our profile.py can shadow it

import argparse
import datetime
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import reference
from autokernel import CUDA, DEVICE, KERNEL_TYPES, KernelType

SCHEMA = 1
CACHE_PATH = autokernel.PREPARE_JSON   # read at call time, so tests can point it elsewhere
COMPILE_MODE = "max-autotune"
BASELINE_DTYPE = torch.float16
COPY_BYTES = 1 << 30                   # 1 GiB: far beyond any L2, so copy speed is HBM speed
MATMUL_SIZES = {"fp16": 8192, "bf16": 8192, "fp32": 4096}
_warned = set()


def warn(message):
    """One line on stderr, once per process."""
    if message not in _warned:
        _warned.add(message)
        print(f"prepare: {message}", file=sys.stderr, flush=True)


def one_line(exc):
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


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
    """Datasheet numbers (autokernel.gpu_spec), Nones on a CPU."""
    if not device["cuda"]:
        return {"name": "cpu", "fp16_tflops": None, "bandwidth_gb_s": None}
    spec = autokernel.gpu_spec(device["name"], device["sm_count"],
                               device.get("max_sm_clock_mhz") or 0.0, tuple(device["capability"]))
    return {"name": spec.name, "fp16_tflops": spec.fp16_tflops,
            "bandwidth_gb_s": spec.bandwidth_gb_s or None}


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


def compile_and_time(fn, inputs, mode=COMPILE_MODE):
    """torch.compile(fn) with static shapes, compile it on `inputs`, time it.
    Returns (us, compile_seconds, error): a failed compile is reported, never raised.

    The inputs are marked static: with CUDA graphs (mode "max-autotune") inductor otherwise copies
    every non-static input into the graph's buffers on each call, a cost the op does not have
    inside a compiled model (its input is already there), which would flatter our kernels."""
    try:
        torch._dynamo.reset()  # fresh caches: no recompile limit, no dynamic-shape guesswork
        for tensor in inputs.values():
            torch._dynamo.mark_static_address(tensor)
        compiled = torch.compile(fn, mode=mode, dynamic=False)
        start = time.perf_counter()
        compiled(**inputs)
        _sync()
        compile_s = time.perf_counter() - start
        return time_us(lambda: compiled(**inputs)), compile_s, None
    except Exception as exc:  # noqa: BLE001  (inductor raises anything; the row records it)
        return None, None, one_line(exc)


def eager_function(ktype):
    """What a model runs today: reference.<type>_eager (a plain function, so torch.compile can
    trace it)."""
    return getattr(reference, f"{ktype.name}_eager")


# ---------------------------------------------------------------------------------------------
# Ceilings
# ---------------------------------------------------------------------------------------------

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
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # fp32 means fp32: no TF32
    try:
        for name, n in MATMUL_SIZES.items():
            a, b = (torch.randn(n, n, device="cuda", dtype=autokernel.DTYPES[name])
                    for _ in range(2))
            out = torch.empty_like(a)
            us = time_us(lambda: torch.matmul(a, b, out=out))
            tflops[name] = 2 * n ** 3 / (us * 1e-6) / 1e12
            log(f"  matmul {name} {n}^3: {us:.1f} us -> {tflops[name]:,.1f} TFLOP/s")
            del a, b, out
    finally:
        torch.set_float32_matmul_precision(precision)
    torch.cuda.empty_cache()
    return {"bandwidth_gb_s": bandwidth, "tflops": tflops, "measured_at": now()}


# ---------------------------------------------------------------------------------------------
# Baselines
# ---------------------------------------------------------------------------------------------

def _as_ktype(ktype):
    return ktype if isinstance(ktype, KernelType) else autokernel.kernel_type(ktype)


def _as_dtype(dtype):
    return dtype if isinstance(dtype, torch.dtype) else autokernel.parse_dtype(dtype)


def baseline_key(ktype, shape, dtype):
    return f"{ktype.name}|{ktype.shape_str(shape)}|{autokernel.DTYPE_NAMES[dtype]}"


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
                      compile_mode=COMPILE_MODE, log=print):
    """Time the wanted baselines at one shape; returns the fields to cache."""
    label = f"{ktype.name} {ktype.shape_str(shape)} {autokernel.DTYPE_NAMES[dtype]}"
    fields = {"kernel_type": ktype.name, "shape": list(shape),
              "dtype": autokernel.DTYPE_NAMES[dtype], "measured_at": now()}
    try:
        inputs = ktype.inputs(shape, dtype, DEVICE)
    except Exception as exc:  # noqa: BLE001  (e.g. out of memory at a model's shape)
        for what in want:
            fields.update({f"{what}_us": None, f"{what}_error": one_line(exc)})
        return fields
    functions = {"eager": eager_function(ktype)}
    if ktype.name in reference.LIBRARY:
        fields["library"], functions["library"] = reference.LIBRARY[ktype.name]
    for what in want:
        if what == "compile":
            log(f"  {label}: torch.compile(mode={compile_mode!r}) ...")
            us, seconds, error = compile_and_time(eager_function(ktype), inputs, compile_mode)
            fields.update(compile_us=us, compile_mode=compile_mode, compile_s=seconds)
        else:
            fn, us, error = functions[what], None, None
            try:
                fn(**inputs)
                _sync()
                us = time_us(lambda: fn(**inputs))
            except Exception as exc:  # noqa: BLE001
                error = one_line(exc)
            fields[f"{what}_us"] = us
        if error:
            fields[f"{what}_error"] = error
            log(f"  {label}: {what} failed: {error}")
        else:
            fields.pop(f"{what}_error", None)
            log(f"  {label}: {what} {fields[f'{what}_us']:.1f} us")
    del inputs
    if CUDA:
        torch.cuda.empty_cache()
    return fields


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
        warn(f"{path} is corrupt ({one_line(exc)}); rebuilding it")
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
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=2) + "\n")
        os.replace(tmp, path)
    return cache


# ---------------------------------------------------------------------------------------------
# The API bench.py uses
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
                   log=None):
    """{"eager_us", "compile_us", "library_us", "library"} for one type, shape and dtype (a
    KernelType or name; torch dtype or "fp16"). Cached values come back at once; missing ones are
    measured once and cached (a failure is cached as None with its error, not retried). compile:
    False skips measuring torch.compile (the cached value, if any, is still returned)."""
    ktype, dtype = _as_ktype(ktype), _as_dtype(dtype)
    shape = tuple(int(d) for d in shape)
    key = baseline_key(ktype, shape, dtype)
    entry = {} if force else dict(read_cache()["baselines"].get(key, {}))
    want = _missing(ktype, entry, compile_mode if compile else None)
    if want:
        for what in want:  # a re-measurement replaces an old failure
            entry.pop(f"{what}_error", None)
        log = log or (lambda message: print(f"prepare:{message}", file=sys.stderr, flush=True))
        entry.update(measure_baselines(ktype, shape, dtype, want, compile_mode, log))
        update_cache(lambda cache: cache["baselines"].__setitem__(key, entry))
    return {"eager_us": entry.get("eager_us"), "compile_us": entry.get("compile_us"),
            "library_us": entry.get("library_us"), "library": entry.get("library")}


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

def parse_types(text):
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        autokernel.kernel_type(name)  # one-line ValueError for an unknown name
    return names or list(KERNEL_TYPES)


def _us(value):
    return "-" if value is None else f"{value:,.1f}"


def print_report(cache, types):
    device, spec, ceilings = cache["device"], cache["spec"], cache["ceilings"]
    if device["cuda"]:
        major, minor = device["capability"]
        clock = device.get("max_sm_clock_mhz")
        print(f"GPU: {device['name']} | {device['sm_count']} SMs | cc {major}.{minor} | "
              f"{device['memory_mib'] / 1024:.1f} GiB | max SM clock "
              f"{clock or '?'} MHz | driver {device.get('driver') or '?'}")
        bw_spec = f"{spec['bandwidth_gb_s']:,.0f} GB/s" if spec["bandwidth_gb_s"] else "? GB/s"
        print(f"datasheet ({spec['name']}): {spec['fp16_tflops']:,.1f} TFLOP/s fp16 dense, "
              f"{bw_spec}")
        if ceilings.get("bandwidth_gb_s"):
            share = (f" ({100 * ceilings['bandwidth_gb_s'] / spec['bandwidth_gb_s']:.0f}% of "
                     "datasheet)" if spec["bandwidth_gb_s"] else "")
            rates = ", ".join(f"{k} {v:,.1f}" for k, v in ceilings["tflops"].items())
            print(f"measured: copy {ceilings['bandwidth_gb_s']:,.0f} GB/s{share}; "
                  f"matmul TFLOP/s {rates}")
        else:
            print("measured: no ceilings (measuring them failed)")
    else:
        print(f"CPU mode: no CUDA GPU ({device['cpu_model']}, {device['cores']} cores). "
              "No ceilings; the times below are CPU times at tiny shapes and are NOT meaningful "
              "for GPU kernels.")
    print(f"torch {device['torch']}, triton {device['triton']}; cache {CACHE_PATH}")
    rows = [("kernel", "shape", "dtype", "eager us", "compile us", "library", "library us")]
    notes = []
    for name in types:
        ktype = KERNEL_TYPES[name]
        shape = (ktype.gpu_shapes if device["cuda"] else ktype.cpu_shapes)["primary"]
        entry = cache["baselines"].get(baseline_key(ktype, shape, BASELINE_DTYPE), {})
        rows.append((name, ktype.shape_str(shape), autokernel.DTYPE_NAMES[BASELINE_DTYPE],
                     _us(entry.get("eager_us")), _us(entry.get("compile_us")),
                     entry.get("library") or "", _us(entry.get("library_us"))))
        notes += [f"{name}: {what} {entry[f'{what}_error']}" for what in
                  ("eager", "compile", "library") if entry.get(f"{what}_error")]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    modes = {e.get("compile_mode") for e in cache["baselines"].values() if e.get("compile_mode")}
    print(f"\nbaselines ({'do_bench median, L2 flushed' if device['cuda'] else 'CPU wall clock'}"
          f"{'; torch.compile mode=' + ','.join(sorted(modes)) if modes else ''}):")
    for row in rows:  # numbers right-aligned
        print("  ".join(cell.rjust(w) if j in (3, 4, 6) else cell.ljust(w)
                        for j, (cell, w) in enumerate(zip(row, widths))))
    for note in notes:
        print(f"  note: {note}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--types", default="", help="comma-separated kernel types (default all)")
    parser.add_argument("--force", action="store_true", help="re-measure even what is cached")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip the torch.compile baselines (max-autotune is slow)")
    parser.add_argument("--compile-mode", default=COMPILE_MODE,
                        help=f"torch.compile mode (default {COMPILE_MODE})")
    args = parser.parse_args(argv)
    try:
        types = parse_types(args.types)
    except ValueError as exc:
        parser.exit(2, f"prepare.py: error: {exc}\n")

    start = time.perf_counter()
    device = detect_device()
    failed = False
    if CUDA:
        print(f"detected {device['name']} ({device['sm_count']} SMs)", flush=True)
        try:
            ceilings = ensure_ceilings(force=args.force, log=lambda m: print(m, flush=True))
            failed = ceilings["bandwidth_gb_s"] is None
        except Exception as exc:  # noqa: BLE001  (out of memory on a busy GPU, say)
            print(f"prepare: measuring the ceilings failed: {one_line(exc)}", flush=True)
            failed = True
    else:
        update_cache(lambda cache: cache.update(device=device, spec=spec_for(device)))
    print("baselines ...", flush=True)
    for name in types:
        ktype = KERNEL_TYPES[name]
        times = baseline_times(ktype, ktype.shapes("primary"), BASELINE_DTYPE,
                               compile=not args.no_compile, compile_mode=args.compile_mode,
                               force=args.force, log=lambda m: print(m, flush=True))
        failed |= times["eager_us"] is None
    print()
    print_report(read_cache(), types)
    print(f"\nprepare: done in {time.perf_counter() - start:.1f} s"
          f"{'' if CUDA else ' (CPU mode: timings not meaningful)'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
