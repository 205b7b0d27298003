"""
CUDA C++ kernel files (BACKEND = "cuda"): their source compiled once per content, and each
`extern "C"` launcher in it callable from Python with tensors.

A CUDA kernel file holds its device code and plain C launchers in one string and loads it at
import, outside any timed call:

    CUDA_SRC = r'''
    __global__ void scale_kernel(const float* x, float* y, float a, long long n) { ... }
    extern "C" int scale(const float* x, float* y, float a, long long n, cudaStream_t stream) {
        scale_kernel<<<(n + 255) / 256, 256, 0, stream>>>(x, y, a, n);
        return (int)cudaGetLastError();
    }
    '''
    _lib = cuda_build.load(CUDA_SRC)
    _lib.scale(x, y, 2.0, x.numel())       # tensors go in as pointers; the stream is filled in

The source needs no torch headers (it includes <cuda_fp16.h> and the like itself), so it builds in
seconds and also on a machine without a GPU (the compile-only test). The build goes through
torch.utils.cpp_extension.load_inline (nvcc, ninja) into workspace/cuda_build/<hash>/ (under
bench.py, the kernel's sandbox directory: autokernel/sandbox.py), keyed by the source, its line
in the file and the compile flags: an unchanged kernel is never rebuilt, and a killed build
leaves only a scratch folder the next build removes. The build's output stays beside the
library as build.log: ptxas's registers and spill bytes per kernel (the library's build_log;
resource_usage reads it), what a CUDA kernel's occupancy turns on. A compile error raises
CudaBuildError with one line, nvcc's first error and its line in the kernel file (a #line
directive maps the source to the file), and saves the full log beside the cache.

The launchers' contract, read from their definitions: `extern "C" int name(...)` returning a
cudaError_t as int (0: launched); parameters are pointers (a tensor, None for NULL, or an int
address), int / long long / float / double scalars (a torch.dtype passed to an int parameter
becomes DTYPE_CODES' number), and at most one cudaStream_t, filled in with torch's current
stream on the tensors' device (so CUDA graphs and side streams see the launch where torch would).

Target: the GPU's own architecture (sm_90a on a Hopper, so wgmma and TMA are available), or
AUTOKERNEL_CUDA_ARCH (e.g. "90a", "80"); without a GPU, sm_90a. The source sees
AUTOKERNEL_SM (e.g. 90) in host and device code alike.
"""
import contextlib
import ctypes
import fcntl
import hashlib
import linecache
import logging
import os
import re
import shutil
import sys
import threading
from pathlib import Path

from autokernel import ROOT, WORKSPACE

# AUTOKERNEL_CUDA_BUILD_DIR: the kernel's sandbox points its builds at its own scratch directory.
CACHE_DIR = Path(os.environ.get("AUTOKERNEL_CUDA_BUILD_DIR") or WORKSPACE / "cuda_build")
# -Xptxas -v: ptxas reports each kernel's registers and spills into the build log (resource_usage).
FLAGS = ["-O3", "-std=c++17", "-lineinfo", "--expt-relaxed-constexpr", "-Xptxas", "-v"]
BUILD_LOG = "build.log"  # beside the library: the whole build's output
_FD1 = threading.Lock()  # a build points fd 1 at its log
DEFAULT_ARCH = "90a"  # without a GPU: the H100 the project measures on
SOURCE_NAME = "CUDA_SRC"  # the file name nvcc reports; errors are mapped back to the kernel file
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}
# Appended to every source: the message for a launcher's non-zero return.
_HELPER = (f'\n#line 1 "{SOURCE_NAME}_helper"\n'
           'extern "C" const char* autokernel_cuda_error_string(int code) {\n'
           '    return cudaGetErrorString((cudaError_t)code);\n}\n')


class CudaBuildError(Exception):
    """The source did not compile or load; the message is one line (what, where, the log)."""
    kind = "CUDA compile error"  # how bench.py's child names it in the row


class CudaLaunchError(RuntimeError):
    """A launcher returned a CUDA error."""


def find_cuda_home():
    """The CUDA toolkit folder (bin/nvcc inside), or None."""
    for key in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(key) and (Path(os.environ[key]) / "bin" / "nvcc").exists():
            return Path(os.environ[key])
    candidates = [Path("/usr/local/cuda")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent.parent)
    return next((c for c in candidates if (c / "bin" / "nvcc").exists()), None)


def nvcc_available():
    return find_cuda_home() is not None


def target_arch():
    """'90a' and the like: AUTOKERNEL_CUDA_ARCH, else the GPU's (Hopper gets its 'a' features),
    else DEFAULT_ARCH."""
    arch = os.environ.get("AUTOKERNEL_CUDA_ARCH", "").strip().removeprefix("sm_")
    if arch:
        if not re.fullmatch(r"\d{2,3}a?", arch):
            raise CudaBuildError(f"AUTOKERNEL_CUDA_ARCH={arch!r} is not an architecture like "
                                 f"90a or 80")
        return arch
    import torch
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")
    return DEFAULT_ARCH


def load(source, name=None):
    """Compile `source` (or take it from the cache) and return its launchers as a CudaLibrary.
    Called from the kernel file at import; `name` is only for messages (default: that file)."""
    frame = sys._getframe(1)
    caller = Path(frame.f_code.co_filename)
    line = _first_line(frame, source)
    shown = name or _shown(caller)
    cuda_home = find_cuda_home()
    if cuda_home is None:
        raise CudaBuildError(f"{shown}: nvcc not found (set CUDA_HOME or put nvcc on PATH): a "
                             f"CUDA kernel file needs the CUDA toolkit")
    arch = target_arch()
    flags = FLAGS + [f"-gencode=arch=compute_{arch},code=sm_{arch}",
                     f"-DAUTOKERNEL_SM={arch.rstrip('a')}"]
    text = f'#line {line} "{SOURCE_NAME}"\n{source}\n{_HELPER}'
    key = hashlib.sha256("\0".join([text, *flags, str(cuda_home)]).encode()).hexdigest()[:20]
    path = _build(text, key, flags, cuda_home, shown)
    try:
        return CudaLibrary(ctypes.CDLL(str(path)), launchers(source), shown,
                           path.parent / BUILD_LOG)
    except OSError as e:
        raise CudaBuildError(f"{shown}: the compiled library does not load ({e})") from None


def _first_line(frame, source):
    """The kernel file's line where the source's first line is (1 if not found verbatim). The
    file's text through linecache: a kernel file loaded from memory (the kept version's) has no
    file, but its loader has the text, so its build key is the one its file had."""
    linecache.checkcache(frame.f_code.co_filename)  # a file edited since it was last read
    text = "".join(linecache.getlines(frame.f_code.co_filename, frame.f_globals))
    at = text.find(source)
    return text.count("\n", 0, at) + 1 if at >= 0 else 1


def _shown(path, outside="name"):
    """path relative to the repo; outside it, its name (or the whole path: outside="path")."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return Path(path).name if outside == "name" else str(path)


def _build(text, key, flags, cuda_home, shown):
    """The cached library for `key`, building it first when missing."""
    final = CACHE_DIR / key
    lib = final / f"ak_{key}.so"
    if lib.exists():
        return lib
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the OS drops it if the holder dies
        if lib.exists():  # another process built it while we waited
            return lib
        for stale in CACHE_DIR.glob(f"tmp-{key}-*"):  # a build killed mid-way
            shutil.rmtree(stale, ignore_errors=True)
        scratch = CACHE_DIR / f"tmp-{key}-{os.getpid()}"
        scratch.mkdir()
        try:
            built = _load_inline(text, key, flags, cuda_home, scratch)
        except RuntimeError as e:
            output = _read(scratch / BUILD_LOG) + str(e)
            shutil.rmtree(scratch, ignore_errors=True)
            log = CACHE_DIR / f"{key}.log"
            log.write_text(output)
            raise CudaBuildError(f"{first_error(output, shown)} (full log: "
                                 f"{_shown(log, outside='path')})") from None
        for leftover in scratch.iterdir():  # objects and ninja files: only the library is kept
            if leftover.name not in (Path(built).name, "cuda.cu", BUILD_LOG):
                with contextlib.suppress(OSError):
                    shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        shutil.rmtree(final, ignore_errors=True)  # a folder without its library: half a copy
        os.replace(scratch, final)
    return lib


def _load_inline(text, key, flags, cuda_home, folder):
    os.environ.setdefault("CUDA_HOME", str(cuda_home))  # before cpp_extension guesses it
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)  # "No CUDA runtime is found": expected when only compiling
    try:
        import torch.utils.cpp_extension as cpp
    finally:
        logger.setLevel(level)
    cpp.CUDA_HOME = str(cuda_home)
    # Quiet, load_inline drops the build's output when it succeeds; verbose, ninja writes it to
    # fd 1, which points at the build log meanwhile: fd 1 is the process's, so one build at a
    # time in a process.
    with _FD1:
        return _build_logged(cpp, text, key, flags, folder)


def _build_logged(cpp, text, key, flags, folder):
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(folder / BUILD_LOG, "w") as log:
            os.dup2(log.fileno(), 1)
            try:
                with contextlib.redirect_stdout(log):  # cpp_extension's own lines too
                    return cpp.load_inline(
                        name=f"ak_{key}", cpp_sources="", cuda_sources=text,
                        extra_cuda_cflags=flags, build_directory=str(folder),
                        no_implicit_headers=True, is_python_module=False, verbose=True)
            finally:
                sys.stdout.flush()
                os.dup2(saved, 1)
    finally:
        os.close(saved)


def _read(path):
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def resource_usage(log):
    """{kernel's mangled name: (registers, spill store bytes)} from a build log's ptxas report."""
    found, name = {}, None
    for line in log.splitlines():
        match = re.search(r"(?:Compiling entry function|Function properties for) '?(\w+)", line)
        if match:
            name = match.group(1)
        elif name and (match := re.search(r"(\d+) bytes spill stores", line)):
            found[name] = (found.get(name, (None, 0))[0], int(match.group(1)))
        elif name and (match := re.search(r"Used (\d+) registers", line)):
            found[name] = (int(match.group(1)), found.get(name, (None, 0))[1])
    return found


_ERROR_PATTERNS = [
    re.compile(rf"^{SOURCE_NAME}\((\d+)\): (?:catastrophic )?error\S*: (.*)$", re.M),
    re.compile(rf"^{SOURCE_NAME}:(\d+):(?:\d+:)? (?:fatal )?error: (.*)$", re.M),
    re.compile(r"^.*?\(\d+\): (?:catastrophic )?error\S*: (.*)$", re.M),
    re.compile(r"^ptxas (?:fatal|error)\s*: (.*)$", re.M),
    re.compile(r"^.*?undefined (?:reference|symbol).*$", re.M),
    re.compile(r"^.*\berror\b.*$", re.M | re.I),
]


def first_error(log, shown="kernel file"):
    """nvcc's first error in a build log, as `<file> line N: message` when it is in the
    kernel's source."""
    for i, pattern in enumerate(_ERROR_PATTERNS):
        match = pattern.search(log)
        if not match:
            continue
        if i < 2:
            return f"{shown} line {match.group(1)}: {_clean(match.group(2))}"
        return f"{shown}: {_clean(match.group(match.lastindex or 0))}"
    return f"{shown}: the build failed"


def _clean(message, limit=200):
    message = re.sub(r"\s+", " ", message).strip()
    return message if len(message) <= limit else message[:limit - 3] + "..."


# ---- the launchers, as Python callables -----------------------------------------------------

_DEFINITION = re.compile(r'extern\s+"C"\s+(?:int|cudaError_t)\s+(\w+)\s*\(([^)]*)\)\s*\{')
_SCALARS = [  # first match wins: the longer names first
    (re.compile(r"\b(long long|int64_t|uint64_t|size_t|ptrdiff_t|long)\b"), ctypes.c_int64),
    (re.compile(r"\bdouble\b"), ctypes.c_double),
    (re.compile(r"\bfloat\b"), ctypes.c_float),
    (re.compile(r"\b(int|int32_t|uint32_t|unsigned|bool)\b"), ctypes.c_int),
]


def launchers(source):
    """{name: [(parameter, kind)]} for each `extern "C" int name(...) {` definition; kind is
    "ptr", "stream" or a ctypes scalar type."""
    code = re.sub(r"//[^\n]*|/\*.*?\*/", " ", source, flags=re.S)
    found = {}
    for name, params in _DEFINITION.findall(code):
        kinds = []
        for param in filter(None, (p.strip() for p in params.split(","))):
            if param == "void":
                continue
            if "*" in param:
                kinds.append((param, "ptr"))
            elif re.search(r"\bcudaStream_t\b", param):
                kinds.append((param, "stream"))
            else:
                kind = next((t for pattern, t in _SCALARS if pattern.search(param)), None)
                if kind is None:
                    raise CudaBuildError(f"launcher {name}: cannot pass parameter {param!r} from "
                                         f"Python; use pointers, int, long long, float, double "
                                         f"or cudaStream_t")
                kinds.append((param, kind))
        if sum(kind == "stream" for _, kind in kinds) > 1:
            raise CudaBuildError(f"launcher {name}: more than one cudaStream_t parameter")
        found[name] = kinds
    return found


class CudaLibrary:
    """The loaded library: one attribute per launcher (see Launcher); build_log: its build's
    output (ptxas's registers and spills per kernel: resource_usage)."""

    def __init__(self, dll, signatures, shown, build_log=None):
        self._dll, self._shown, self.build_log = dll, shown, build_log
        error_string = dll.autokernel_cuda_error_string
        error_string.restype, error_string.argtypes = ctypes.c_char_p, [ctypes.c_int]
        for name, params in signatures.items():
            setattr(self, name, Launcher(dll, name, params, error_string))

    def __getattr__(self, name):  # only reached for names that are not launchers
        raise AttributeError(f"{self._shown} has no launcher {name!r}: define it as "
                             f'`extern "C" int {name}(...) {{ ... }}` in CUDA_SRC')


class Launcher:
    """One extern "C" launcher: call it with the parameters other than the stream, in order."""

    def __init__(self, dll, name, params, error_string):
        self.name, self.params, self.error_string = name, params, error_string
        self.fn = getattr(dll, name)
        self.fn.restype = ctypes.c_int
        self.fn.argtypes = [ctypes.c_void_p if kind in ("ptr", "stream") else kind
                            for _, kind in params]
        self.stream_at = next((i for i, (_, kind) in enumerate(params) if kind == "stream"), None)
        self.arity = len(params) - (self.stream_at is not None)

    def __call__(self, *args):
        import torch
        if len(args) != self.arity:
            wanted = ", ".join(p for p, kind in self.params if kind != "stream")
            raise TypeError(f"{self.name} takes {self.arity} arguments ({wanted}), got "
                            f"{len(args)}")
        values, device = [], None
        for arg, (param, kind) in zip(args, (p for p in self.params if p[1] != "stream")):
            if isinstance(arg, torch.Tensor):
                if not arg.is_cuda:
                    raise ValueError(f"{self.name}: {param} is a {arg.device} tensor; CUDA "
                                     f"kernels take CUDA tensors")
                device = arg.device if device is None else device
                arg = arg.data_ptr()
            elif isinstance(arg, torch.dtype):
                name = str(arg).removeprefix("torch.")
                if name not in DTYPE_CODES:
                    raise ValueError(f"{self.name}: {name} is not one of the dtypes the CUDA "
                                     f"kernels take ({', '.join(DTYPE_CODES)})")
                arg = DTYPE_CODES[name]
            values.append(arg)
        if self.stream_at is not None:
            values.insert(self.stream_at, current_stream(device))
        code = self.fn(*values)
        if code:
            raise CudaLaunchError(f"{self.name}: {self.error_string(code).decode()} "
                                  f"(CUDA error {code})")


def current_stream(device=None):
    """torch's current CUDA stream as a raw handle (cheap: no Stream object)."""
    import torch
    index = torch.cuda.current_device() if device is None or device.index is None \
        else device.index
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw else torch.cuda.current_stream(index).cuda_stream
