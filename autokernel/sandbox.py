"""
The kernel's process, confined before the kernel's code runs (Linux Landlock, unprivileged).

bench.py's child (autokernel/child.py) imports an untrusted kernel file as the judge's own user.
Before it does, it confines itself for good (the kernel cannot undo it, nor can anything it
starts):
  * writes go only to its scratch directory (workspace/sandbox/<hash of the kernel's source>/,
    where its Triton, CUDA, torch-extension and inductor caches and its temporary files point)
    and to /dev (the GPU's device files, /dev/shm for shared tensors, /dev/null);
  * everything can be read and run but the judge's private directory (workspace/judge/, where
    the crash record lives);
  * from Landlock ABI 6, no signal to a process outside the sandbox (the judge) and no abstract
    unix socket outside it; ptrace of such a process is refused at every ABI;
  * no new privileges (a setuid program runs without them).
One scratch directory per source: the kept version of a kernel finds the caches it built when it
was the candidate, and no other kernel can write them (a slower binary planted in the kept
version's cache would let a slower candidate win).

Where Landlock is missing (not Linux, an old kernel, disabled) the child runs unconfined and
bench.py says so on one line; AUTOKERNEL_SANDBOX=off does the same on purpose (the tests of
the judge's second line of defence, snapshot and restore, need a kernel that can tamper).
"""
import ctypes
import errno
import hashlib
import os
import platform
import shutil
import stat
import sys
from pathlib import Path

from autokernel import ROOT, WORKSPACE

SCRATCH_ROOT = WORKSPACE / "sandbox"
PRIVATE_DIR = WORKSPACE / "judge"  # the judge's own files: no kernel's process reads them
KEEP_SCRATCH = 64  # scratch directories kept between runs (the most recently used)

# Landlock's interface (linux/landlock.h); the syscall numbers are the same on both.
SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
MAKE_SYM, REFER, TRUNCATE, IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # the rest are a folder's
READ = EXECUTE | READ_FILE | READ_DIR
WRITE = (1 << 16) - 1 & ~(MAKE_CHAR | MAKE_BLOCK)  # everything but device nodes


def rights_of(abi):
    """The filesystem rights an ABI knows (REFER from 2, TRUNCATE from 3, IOCTL_DEV from 5):
    the ruleset handles all of them, so whatever no rule grants is denied."""
    return (1 << 13) - 1 | (REFER if abi >= 2 else 0) | (TRUNCATE if abi >= 3 else 0) \
        | (IOCTL_DEV if abi >= 5 else 0)


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def landlock_abi():
    """(the running kernel's Landlock ABI, None) or (None, why there is none)."""
    if os.environ.get("AUTOKERNEL_SANDBOX", "").lower() == "off":
        return None, "AUTOKERNEL_SANDBOX=off"
    if not sys.platform.startswith("linux"):
        return None, f"Landlock is Linux's; this is {sys.platform}"
    numbers = SYSCALLS.get(platform.machine())
    if numbers is None:
        return None, f"no Landlock syscall numbers known for {platform.machine()}"
    abi = _libc().syscall(numbers[0], None, ctypes.c_size_t(0),
                          ctypes.c_uint32(CREATE_RULESET_VERSION))
    if abi < 0:
        code = ctypes.get_errno()
        why = {errno.ENOSYS: "this Linux kernel has no Landlock",
               errno.EOPNOTSUPP: "Landlock is disabled at boot"}.get(code, os.strerror(code))
        return None, why
    return abi, None


# ---- the judge's side: where a kernel's process may write, and what the verdict says ------

def prepare(source: bytes):
    """The confinement for a child that will run `source` (a kernel file's bytes): a plain
    dict, passed to the child. Creates its scratch directory and the judge's private one."""
    abi, why = landlock_abi()
    scratch = SCRATCH_ROOT / hashlib.sha256(source).hexdigest()[:16]
    for sub in ("tmp", "cache"):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    os.utime(scratch)  # the most recently used are kept (prune)
    PRIVATE_DIR.mkdir(parents=True, exist_ok=True)
    os.chmod(PRIVATE_DIR, 0o700)
    return {"abi": abi, "why": why, "scratch": str(scratch), "private": str(PRIVATE_DIR)}


def seals_the_repo(spec):
    """Whether the kernel's process can change no file outside its scratch directory: confined
    at an ABI that handles truncate(2) too (from 3; before, a path could be cut short)."""
    return spec["abi"] is not None and spec["abi"] >= 3


def describe(spec):
    """One line: which confinement the kernel's process runs under."""
    if spec["abi"] is None:
        return f"none, the kernel's process runs unconfined ({spec['why']})"
    scratch = Path(spec["scratch"])
    shown = scratch.relative_to(ROOT) if scratch.is_relative_to(ROOT) else scratch
    scoped = "signals scoped" if spec["abi"] >= 6 else "signals not scoped (Landlock ABI < 6)"
    return f"landlock ABI {spec['abi']} (writes: {shown}, /dev; {scoped})"


def environment(spec):
    """The variables that point the child's caches and temporary files at its scratch
    directory. They are in its environment from its first instruction (the CUDA driver reads
    CUDA_CACHE_PATH once, at its start), so the judge sets them around the spawn."""
    scratch = Path(spec["scratch"])
    cache = scratch / "cache"
    return {"TMPDIR": str(scratch / "tmp"), "TRITON_HOME": str(cache),
            "TRITON_CACHE_DIR": str(cache / "triton"),
            "TORCH_EXTENSIONS_DIR": str(cache / "torch_extensions"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            "CUDA_CACHE_PATH": str(cache / "cuda"), "XDG_CACHE_HOME": str(cache),
            "AUTOKERNEL_CUDA_BUILD_DIR": str(cache / "cuda_build")}


class spawned_with:
    """os.environ with `spec`'s variables while a child is spawned (it copies the judge's
    environment at that moment), then as it was."""

    def __init__(self, spec):
        self.values = environment(spec)

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc):
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def prune(keep=KEEP_SCRATCH):
    """Delete all but the `keep` most recently used scratch directories."""
    if not SCRATCH_ROOT.is_dir():
        return
    def used(path):  # a re-gate beside this run may prune the same directory first
        try:
            return path.stat().st_mtime
        except FileNotFoundError:
            return 0.0
    dirs = sorted((p for p in SCRATCH_ROOT.iterdir() if p.is_dir()), key=used, reverse=True)
    for old in dirs[keep:]:
        shutil.rmtree(old, ignore_errors=True)


# ---- the child's side -----------------------------------------------------------------------

class SandboxError(Exception):
    """The confinement could not be applied; the kernel must not run."""


def confine(spec):
    """Confine this process for good, as `spec` (from prepare) says. Call it before the
    kernel's code runs; SandboxError when Landlock is there but refused the rules."""
    import tempfile
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    if spec["abi"] is None:
        return
    abi, libc = spec["abi"], _libc()
    create, add_rule, restrict = SYSCALLS[platform.machine()]
    handled = rights_of(abi)
    attr = RulesetAttr(handled, 0, SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET if abi >= 6 else 0)
    size = ctypes.sizeof(RulesetAttr) if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise SandboxError(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        for path, rights in rules(spec["private"], spec["scratch"]):
            _add(libc, add_rule, ruleset, path, rights & handled)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise SandboxError(f"prctl(NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
        if libc.syscall(restrict, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise SandboxError(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)


def rules(private, scratch):
    """(path, rights) pairs: every folder listable; every file readable and runnable but those
    under `private`; `scratch` and /dev writable. Landlock grants rights beneath a path and
    cannot subtract, so reading is granted on each entry beside the way down to `private` (the
    folders on that way stay listable: Python's import system lists them)."""
    private = Path(private).resolve()
    way = [*reversed(private.parents), private]
    out = [("/", READ_DIR)]
    for folder, next_one in zip(way, way[1:]):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            path = folder / name
            # A link beside the way that leads back onto it would grant it all.
            if name != next_one.name and not private.is_relative_to(path.resolve()):
                out.append((str(path), READ))
    return out + [(str(scratch), WRITE), ("/dev", WRITE)]


def _add(libc, add_rule, ruleset, path, rights):
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:  # a dangling link, a file gone since the listing: nothing to grant
        return
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= FILE_RIGHTS  # a folder's rights on a file are an error
        attr = PathBeneathAttr(rights, fd)
        if libc.syscall(add_rule, ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH),
                        ctypes.byref(attr), ctypes.c_uint32(0)) != 0:
            raise SandboxError(f"landlock_add_rule {path}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)
