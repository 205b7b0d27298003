"""
The night's state, guarded against the kernel's process.

The kernel's child process runs as the same user as bench.py, so it can write any file, run git
and start processes. bench.py therefore:
  * runs alone: `exclusive()` holds an flock on workspace/bench.lock (the OS drops it when the
    holder dies, so a killed run's lock is simply taken over);
  * snapshots before the child starts (`Snapshot.take`) and restores after it (`restore`), byte
    for byte: results.tsv, every tracked file, git's own files (HEAD, refs, index, config, hooks,
    reflogs: all of .git but its objects), the workspace's kernel files and JSON, and it deletes
    untracked files and __pycache__ entries the run created (a planted `json.py` or a forged .pyc
    would otherwise run inside the next judge). The snapshot is also written to
    workspace/bench_snapshot.json, so a run killed mid-way is restored by the next one;
  * leaves no process behind: bench.py is a child subreaper (Linux), so everything the child
    starts, even in a new session, stays its descendant and `kill_descendants` ends it.
"""
import base64
import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from autokernel import ROOT, WORKSPACE
from autokernel.cli import UsageError
from autokernel.git import git

LOCK_PATH = WORKSPACE / "bench.lock"
SNAPSHOT_PATH = WORKSPACE / "bench_snapshot.json"
PR_SET_CHILD_SUBREAPER = 36
SKIP_DIRS = {".git", ".venv", "node_modules", ".triton"}


@contextlib.contextmanager
def exclusive(lock_path=LOCK_PATH):
    """One bench.py per repo at a time. A second one gets a one-line UsageError."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise UsageError(f"another bench.py is judging in this repo ({holder}); wait for it "
                             f"to finish (one gate at a time keeps timings and git honest)")
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} since {time.strftime('%H:%M:%S')}\n")
        f.flush()
        try:
            yield
        finally:
            f.seek(0)
            f.truncate()


# ---- processes ------------------------------------------------------------------------------

def become_subreaper():
    """Orphans of our descendants get reparented to us, not to init (Linux only)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _stat(pid):
    """The fields of /proc/<pid>/stat after the command name (state, ppid, ...), or None when
    the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _parents():
    """{pid: its parent's pid} for every process."""
    found = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        fields = _stat(entry) if entry.isdigit() else None
        if fields:
            found[int(entry)] = int(fields[1])
    return found


def process_state(pid):
    """The one-letter state of a process (R, S, T when stopped, Z...), or None when it is gone."""
    fields = _stat(pid)
    return fields[0] if fields else None


def children(pid=None):
    """The pids whose parent is `pid` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    return [p for p, parent in _parents().items() if parent == pid]


def descendants(pid=None, parents=None):
    """Every pid below `pid` (default: this process), children first; parents: a _parents()
    map already read."""
    parents, found = parents or _parents(), []
    frontier = {os.getpid() if pid is None else pid}
    while frontier:
        below = [p for p, parent in parents.items() if parent in frontier]
        found += below
        frontier = set(below)
    return found


@contextlib.contextmanager
def others_stopped(keep):
    """Every process below this one stopped (SIGSTOP) but `keep` and the processes below it,
    and continued (SIGCONT) on leaving: while one kernel's window is on the clock, no other
    kernel's process (nor anything it started, in any session) can take a CPU or launch GPU
    work. Scans again until a scan finds nothing new (a process may fork meanwhile)."""
    stopped = set()
    try:
        for _ in range(10):
            parents = _parents()  # one read of /proc for both trees
            spared = {keep, *descendants(keep, parents)}
            new = [p for p in descendants(None, parents) if p not in spared and p not in stopped]
            if not new:
                break
            for p in new:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p, signal.SIGSTOP)
                    stopped.add(p)
            _until_stopped(new)
        yield
    finally:
        for p in stopped:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGCONT)


def _until_stopped(pids, timeout_s=1.0):
    """Wait until each of pids is stopped or gone (a signal is delivered asynchronously: a
    process running on another CPU goes on for a moment)."""
    deadline = time.monotonic() + timeout_s
    for p in pids:
        while time.monotonic() < deadline and process_state(p) not in ("T", "t", "Z", None):
            time.sleep(0.0002)


def kill_descendants(timeout_s=5.0, spare=()):
    """SIGKILL every process below this one (and reap it) until none is left, but the pids in
    spare. Returns how many there were. Killing a parent reparents its children to us
    (subreaper), so repeat."""
    me, killed, deadline = os.getpid(), 0, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children_left = [pid for pid in children(me) if pid not in spare]
        if not children_left:
            break
        for pid in children_left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        for pid in children_left:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, 0)
    return killed


# ---- files ----------------------------------------------------------------------------------

def _read(path):
    try:
        return Path(path).read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None


def _git_internal_files(root):
    """Every file of .git but its object store (objects are content-addressed: a new one
    changes nothing, and we never delete one)."""
    gitdir = Path(root) / ".git"
    if not gitdir.is_dir():
        return []
    out = []
    for dirpath, dirnames, filenames in os.walk(gitdir):
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) == gitdir and d == "objects")]
        out += [os.path.join(dirpath, f) for f in filenames]
    return out


def _pycache_entries(root):
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        if os.path.basename(dirpath) == "__pycache__":
            for f in filenames:
                path = os.path.join(dirpath, f)
                with contextlib.suppress(OSError):
                    st = os.stat(path)
                    out[path] = [st.st_size, st.st_mtime_ns]
    return out


def _git_list(root, *args):
    proc = git("ls-files", "-z", *args, cwd=root)
    return [p for p in proc.stdout.split("\0") if p] if proc.returncode == 0 else []


class Snapshot:
    """What the night has, as bytes: restored after the child, whatever it did."""

    def __init__(self, files, absent, untracked, pycache, root):
        self.files, self.absent = files, absent  # path -> bytes; paths that did not exist
        self.untracked, self.pycache, self.root = untracked, pycache, str(root)

    @classmethod
    def take(cls, results_path, root=ROOT, workspace=WORKSPACE):
        paths = [str(results_path)] + _git_internal_files(root)
        paths += [str(Path(root) / p) for p in _git_list(root)]
        if Path(workspace).is_dir():
            paths += [str(p) for p in Path(workspace).iterdir()
                      if p.suffix in (".py", ".json", ".tsv") and p != SNAPSHOT_PATH]
        files, absent = {}, []
        for path in dict.fromkeys(paths):
            data = _read(path)
            (absent.append(path) if data is None else files.__setitem__(path, data))
        untracked = _git_list(root, "--others", "--exclude-standard")
        return cls(files, absent, untracked, _pycache_entries(root), root)

    def save(self, path=SNAPSHOT_PATH):
        """On disk for a run killed before it restores (the next bench.py restores it)."""
        data = {"root": self.root, "absent": self.absent, "untracked": self.untracked,
                "pycache": self.pycache,
                "files": {p: base64.b64encode(b).decode() for p, b in self.files.items()}}
        tmp = Path(str(path) + ".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)

    @classmethod
    def load(cls, path=SNAPSHOT_PATH):
        data = json.loads(Path(path).read_text())
        files = {p: base64.b64decode(b) for p, b in data["files"].items()}
        return cls(files, data["absent"], data["untracked"], data["pycache"], data["root"])

    def restore(self):
        """Put everything back; returns what had changed (paths relative to the repo), __pycache__
        aside."""
        changed = []
        for path, data in self.files.items():  # .git's own files first: git runs below
            if _read(path) != data:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                tmp = Path(path + ".autokernel-restore")
                tmp.write_bytes(data)
                tmp.replace(path)
                changed.append(path)
        gitdir = str(Path(self.root) / ".git")
        known = set(self.files) | set(self.absent)
        for path in _git_internal_files(self.root):
            if path not in known and not path.endswith(".lock"):
                os.unlink(path)
                changed.append(path)
        for path in self.absent:
            if os.path.lexists(path) and not path.startswith(gitdir + os.sep):
                os.unlink(path)
                changed.append(path)
        before = set(self.untracked)
        for rel in _git_list(self.root, "--others", "--exclude-standard"):
            if rel not in before:
                os.unlink(Path(self.root) / rel)
                changed.append(str(Path(self.root) / rel))
        for path, stat in _pycache_entries(self.root).items():
            if self.pycache.get(path) != stat:
                # A forged .pyc would run inside the next judge. Not reported: importing a
                # module writes its .pyc, so an honest run makes new ones too.
                os.unlink(path)
        return sorted({_rel(p, self.root) for p in changed})


def _rel(path, root):
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(path)


def recover(path=SNAPSHOT_PATH):
    """A snapshot left by a bench.py killed mid-run: restore it. Returns what changed, or None."""
    if not Path(path).exists():
        return None
    try:
        changed = Snapshot.load(path).restore()
    except (ValueError, KeyError, OSError) as e:
        raise UsageError(f"{path} (left by a killed bench.py) cannot be read ({e}); check the "
                         f"repo with `git status`, then delete it")
    Path(path).unlink()
    return changed


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
