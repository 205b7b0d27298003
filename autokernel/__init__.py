"""
AutoKernel's library: the top-level scripts are thin CLIs over its modules.

This module holds the facts that need no torch (paths, the kernel types' names) and the one piece
of process setup every script needs first: the repo's profile.py shadows the standard library's
`profile`, which torch.compile needs (cProfile imports it), so the real one is loaded into
sys.modules here. Everything else lives in a module with one job:

    kernel_types  the one table of kernel types (inputs, oracle, FLOP/byte counts, shape sets,
                  tolerances, adversarial inputs) and CPU mode (TRITON_INTERPRET=1 without a
                  GPU, set before triton is imported); importing it imports torch
    reference     each type's float64 oracle and eager version (what kernel_fn must compute)
    contract      the kernel file contract           results    results.tsv and the keep rule
    workspace     profile.json, plan.json, ...      baselines  prepare.json: ceilings, baselines
    gate          the five stages (the judge)        child      the untrusted kernel process
    judge         that process seen from the judge   experiment one bench.py run, its row
    kinds         the kinds of problem the judge asks about (kernel types, KernelBench)
    timing        paired rounds, the judge's clock   state      lock, snapshot/restore, reaping
    regate        the morning re-check               swap       how a kernel gets into a model
    kernel_call   a kernel file as a checked call    weight_cache  the matmul's weight copies
    patching      torch calls with a rule's handler in front, undone after the block
    swap_torch, swap_modules, swap_hf  the swap rules: torch calls, modules, transformers
    endtoend      running and timing whole models    recognize  which kernel type an op is
    graph_capture which kernel type a computation in the captured graph is, whoever wrote it:
                  patterns(_rotary) spell the types, matches picks the blocks, fx_vocabulary
                  names the graph's ops, mask_values evaluates masks
    regions       the rest of the model's code cut into regions, each with a reference file
    night         per-kernel stats, Amdahl            gpus       datasheet peaks; is_rocm()
    ops           a kernel file as a torch custom op  cuda_build CUDA C++ sources compiled
    export        the package export.py writes        kernelbench(_score, _setup) KernelBench
    cli, git      one-line errors; the one git wrapper

`autokernel.KERNEL_TYPES`, `autokernel.CUDA` and the other names of kernel_types are reachable
from here too; they load it (and torch) on first use, so scripts that need neither stay quick.
"""
import importlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load_stdlib_profile():
    """Put the standard library's `profile` (and cProfile) in sys.modules before our profile.py
    can shadow it. Scripts run from the repo root have ROOT first on sys.path."""
    if "profile" in sys.modules and hasattr(sys.modules["profile"], "run"):
        return
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
    sys.modules.pop("profile", None)
    try:
        import profile  # noqa: F401  (the stdlib one)
        import cProfile  # noqa: F401
    finally:
        sys.path[:] = saved


_load_stdlib_profile()


# ---------------------------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------------------------

KERNEL_PY = ROOT / "kernel.py"
KERNELS_DIR = ROOT / "kernels"
MODELS_DIR = ROOT / "models"
# Everything a run writes but git keeps out; AUTOKERNEL_WORKSPACE moves it (the tests do, so
# that a test run never touches a night's files).
WORKSPACE = Path(os.environ.get("AUTOKERNEL_WORKSPACE") or ROOT / "workspace")
RESULTS_TSV = ROOT / "results.tsv"
PREPARE_JSON = WORKSPACE / "prepare.json"        # GPU facts, measured ceilings, baseline times
PROFILE_JSON = WORKSPACE / "profile.json"        # profile.py output
PLAN_JSON = WORKSPACE / "plan.json"              # extract.py output: kernels in priority order
ORCHESTRATE_JSON = WORKSPACE / "orchestrate.json"  # orchestrate.py state
VERIFY_JSON = WORKSPACE / "verify.json"
PROGRESS_PNG = ROOT / "progress.png"


def starters_dir(backend="triton"):
    """Where a backend's starter kernels live: kernels/ (Triton), kernels/cuda/ (CUDA C++)."""
    return KERNELS_DIR / "cuda" if backend == "cuda" else KERNELS_DIR


# Files bench.py refuses to judge with when they differ from the committed version.
HARNESS_FILES = ("bench.py", "autokernel")
# The registered kernel types, in the table's order (autokernel.kernel_types.KERNEL_TYPES).
KERNEL_TYPE_NAMES = ("matmul", "softmax", "layernorm", "rmsnorm", "flash_attention", "fused_mlp",
                     "cross_entropy", "rotary_embedding", "reduce", "qkv_rotary",
                     "decode_attention")


def __getattr__(name):
    """The names of kernel_types, loaded on first use (it imports torch). A submodule's name
    (`from autokernel import git`) imports just that submodule."""
    if (Path(__file__).parent / f"{name}.py").is_file():
        return importlib.import_module(f"{__name__}.{name}")
    module = importlib.import_module("autokernel.kernel_types")
    if not hasattr(module, name):
        raise AttributeError(f"module 'autokernel' has no attribute {name!r}")
    return getattr(module, name)
