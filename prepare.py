"""
One-time setup: detect the GPU, measure its ceilings, time the PyTorch baselines. Cached.

    uv run prepare.py                          # detect, measure once, print the table
    uv run prepare.py --types softmax,matmul   # baselines for some types only
    uv run prepare.py --force                  # re-measure even what is cached
    uv run prepare.py --no-compile             # skip torch.compile (max-autotune takes minutes)

What is measured, how, and the cache's format (workspace/prepare.json): autokernel/baselines.py,
which bench.py and bench_starters.py read the same cache through.
"""
import autokernel.kernel_types  # noqa: F401  (first: CPU mode is set before triton is imported)

import argparse
import sys
import time

from autokernel import CUDA, KERNEL_TYPES, baselines
from autokernel.baselines import (BASELINE_DTYPE, COMPILE_MODE, baseline_key, baseline_times,
                                  detect_device, ensure_ceilings, parse_types, read_cache,
                                  spec_for, update_cache)
from autokernel.cli import ArgumentParser, describe, run_main


def main(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0],
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
            print(f"prepare: measuring the ceilings failed: {describe(exc)}", flush=True)
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


def print_report(cache, types):
    _print_device(cache)
    _print_baselines(cache, types)


def _print_device(cache):
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
    print(f"torch {device['torch']}, triton {device['triton']}; cache {baselines.CACHE_PATH}")


def _print_baselines(cache, types):
    device = cache["device"]
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
    clock = "bench.py's clock: fresh inputs, L2 flushed, CUDA graph" if device["cuda"] else \
        "CPU wall clock"
    print(f"\nbaselines ({clock}"
          f"{'; torch.compile mode=' + ','.join(sorted(modes)) if modes else ''}):")
    for row in rows:  # numbers right-aligned
        print("  ".join(cell.rjust(w) if j in (3, 4, 6) else cell.ljust(w)
                        for j, (cell, w) in enumerate(zip(row, widths))))
    for note in notes:
        print(f"  note: {note}")


def _us(value):
    return "-" if value is None else f"{value:,.1f}"


if __name__ == "__main__":
    sys.exit(run_main("prepare.py", main))
