"""
The night's state, guarded against the kernel's process.

The kernel's child process runs as the same user as bench.py, so it can write any file, run git
and start processes. bench.py therefore:
  * runs alone: `exclusive()` holds an flock on workspace/bench.lock (the OS drops it when the
    holder dies, so a killed run's lock is simply taken over); runs that record nothing
    (--correctness-only) share it with each other, never with a run that records;
  * snapshots before the child starts (`Snapshot.take`) and restores after it (`restore`), byte
    for byte: results.tsv, every tracked file, git's own files (HEAD, refs, index, config, hooks,
    reflogs: all of .git but its objects), the workspace's kernel files and JSON, and it deletes
    untracked files and __pycache__ entries the run created (a planted `json.py` or a forged .pyc
    would otherwise run inside the next judge). Where the sandbox sealed the repo
    (sandbox.seals_the_repo), the kernel's process could not write any of it: what changed is
    another process's (the user's edit, a new file), so only results.tsv is put back and the
    rest is named, left as it is (`Confined`);
  * leaves a crash record: the snapshot, with its hash and the row of a killed run, in
    workspace/judge/ (the judge's private directory: the kernel's sandbox can neither read nor
    write it). The next bench.py checks it before trusting it (its hash; it holds no row
    results.tsv lacks; every commit it would put back on the branch is named by one of its
    rows), restores everything but the candidate (a kernel is never put back as the next file
    to judge) and appends the killed run's CRASH row. A record that fails its check is set
    aside, one line says why, and nothing of it is restored;
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

from autokernel import ROOT, WORKSPACE, results
from autokernel.cli import UsageError, one_line
from autokernel.git import git
from autokernel.sandbox import PRIVATE_DIR

LOCK_PATH = WORKSPACE / "bench.lock"
SNAPSHOT_PATH = PRIVATE_DIR / "bench_snapshot.json"  # the crash record
KILLED = "the judge was killed during the run"
PR_SET_CHILD_SUBREAPER = 36
SKIP_DIRS = {".git", ".venv", "node_modules", ".triton"}


@contextlib.contextmanager
def exclusive(lock_path=LOCK_PATH, shared=False):
    """One bench.py per repo at a time; a second one gets a one-line UsageError. shared: a run
    that records nothing (--correctness-only, verify.py's re-gates): any number of them at once,
    none while a bench.py that records holds the lock."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as f:
        try:
            fcntl.flock(f, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "re-gates: bench.py --correctness-only"
            raise UsageError(f"another bench.py is judging in this repo ({holder}); wait for it "
                             f"to finish (one gate at a time keeps timings and git honest)")
        if shared:  # the holder line is the exclusive run's
            yield
            return
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
def others_stopped(keep, also=()):
    """Every process below this one stopped (SIGSTOP) but `keep` and the processes below it
    (and the pids `also`, not below them), and continued (SIGCONT) on leaving: while one kernel's window is on the clock, no other
    kernel's process (nor anything it started, in any session) can take a CPU or launch GPU
    work. Scans again until a scan finds nothing new (a process may fork meanwhile)."""
    stopped = set()
    try:
        for _ in range(10):
            parents = _parents()  # one read of /proc for both trees
            spared = {keep, *descendants(keep, parents), *also}
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


def end_strays(helpers=()):
    """Kill every process below this one but the judge's own `helpers` (descendants() taken
    before the children started), and say what the others were:
    [command line] of those that were left (a process a kernel started that outlived its child's
    process group: in a session of its own, say). Call it once the children are stopped."""
    strays = [p for p in descendants() if p not in helpers]
    found = [command_line(p) for p in strays]
    for pid in strays:  # those below a helper (the zygote's children) too
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    kill_descendants(spare=helpers)
    return [c for c in found if c is not None]


def command_line(pid):
    """A process's command line, one line of at most 80 characters; None when it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return None
    text = " ".join(w.decode(errors="replace") for w in words if w) or f"pid {pid}"
    return text if len(text) <= 80 else text[:77] + "..."


def resource_tracker_pid():
    """multiprocessing's resource tracker, a helper of the judge's: started with the first child,
    it serves every later one."""
    from multiprocessing import resource_tracker
    return getattr(resource_tracker._resource_tracker, "_pid", None)


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
                      if p.suffix in (".py", ".json", ".tsv")]
        files, absent = {}, []
        for path in dict.fromkeys(paths):
            data = _read(path)
            (absent.append(path) if data is None else files.__setitem__(path, data))
        untracked = _git_list(root, "--others", "--exclude-standard")
        return cls(files, absent, untracked, _pycache_entries(root), root)

    def save(self, path=SNAPSHOT_PATH, results_path=None, candidate=None, crash_row=None):
        """The crash record, for a run killed before it restores: this snapshot, where
        results.tsv is, the file being judged (never restored) and the row the next bench.py
        appends for the killed run, under the hash of it all."""
        head = git("rev-parse", "-q", "--verify", "HEAD", cwd=self.root)
        body = json.dumps({
            "root": self.root, "absent": self.absent, "untracked": self.untracked,
            "pycache": self.pycache,
            "files": {p: base64.b64encode(b).decode() for p, b in self.files.items()},
            "head": head.stdout.strip() if head.returncode == 0 else None,
            "results": str(results_path) if results_path else None,
            "candidate": str(Path(candidate).resolve()) if candidate else None,
            "crash_row": crash_row})
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        os.chmod(Path(path).parent, 0o700)
        tmp = Path(str(path) + ".tmp")
        tmp.write_text(json.dumps({"sha256": digest(body.encode()), "body": body}))
        tmp.replace(path)

    @classmethod
    def load(cls, path=SNAPSHOT_PATH):
        """(the snapshot, the record's other fields); ValueError when it is not one."""
        record = json.loads(Path(path).read_text())
        if digest(record["body"].encode()) != record["sha256"]:
            raise ValueError("its hash does not match its contents")
        data = json.loads(record["body"])
        files = {p: base64.b64decode(b) for p, b in data["files"].items()}
        return cls(files, data["absent"], data["untracked"], data["pycache"], data["root"]), data

    def restore(self, but=None):
        """Put everything back (but the file `but`); returns what had changed (paths relative
        to the repo), __pycache__ aside."""
        changed = []
        for path, data in self.files.items():  # .git's own files first: git runs below
            if path == but:
                continue
            if _read(path) != data:
                _put_back(path, data)
                changed.append(path)
        gitdir = str(Path(self.root) / ".git")
        known = set(self.files) | set(self.absent)
        for path in _git_internal_files(self.root):
            if path not in known and not path.endswith(".lock"):
                os.unlink(path)
                changed.append(path)
        for path in self.absent:
            if os.path.lexists(path) and not path.startswith(gitdir + os.sep) and path != but:
                os.unlink(path)
                changed.append(path)
        before = set(self.untracked)
        for rel in _git_list(self.root, "--others", "--exclude-standard"):
            if rel not in before and str(Path(self.root) / rel) != but:
                os.unlink(Path(self.root) / rel)
                changed.append(str(Path(self.root) / rel))
        for path, stat in _pycache_entries(self.root).items():
            if self.pycache.get(path) != stat:
                # A forged .pyc would run inside the next judge. Not reported: importing a
                # module writes its .pyc, so an honest run makes new ones too.
                os.unlink(path)
        return sorted({_rel(p, self.root) for p in changed})

    def changed(self, but=None):
        """What differs from the snapshot (paths relative to the repo), without touching
        anything: files whose bytes changed, files that appeared (untracked or in .git),
        __pycache__ aside."""
        gitdir = str(Path(self.root) / ".git")
        paths = [p for p, data in self.files.items() if p != but and _read(p) != data]
        paths += [p for p in self.absent
                  if os.path.lexists(p) and not p.startswith(gitdir + os.sep) and p != but]
        known = set(self.files) | set(self.absent)
        paths += [p for p in _git_internal_files(self.root)
                  if p not in known and not p.endswith(".lock")]
        before = set(self.untracked)
        paths += [str(Path(self.root) / rel)
                  for rel in _git_list(self.root, "--others", "--exclude-standard")
                  if rel not in before and str(Path(self.root) / rel) != but]
        return sorted({_rel(p, self.root) for p in paths})


class Confined:
    """A Snapshot where the kernel's process could not write the repo (sandbox.seals_the_repo):
    what changed during the run is someone else's (the user editing a file, committing, saving
    a new one), and putting it back would undo their work. Only the files that nothing but the
    judge writes (the night's results.tsv) are put back; restore() returns those that had
    changed, and `others` collects the rest, named and left as they are."""

    def __init__(self, snapshot, own):
        self.snapshot, self.own, self.others = snapshot, [str(p) for p in own], set()

    def save(self, *args, **kwargs):
        self.snapshot.save(*args, **kwargs)

    def restore(self, but=None):
        changed = set(self.snapshot.changed(but))
        own = {_rel(p, self.snapshot.root) for p in self.own}
        self.others |= changed - own
        for path in self.own:
            data = self.snapshot.files.get(path)
            if data is None:
                if path in self.snapshot.absent and os.path.lexists(path):
                    os.unlink(path)
            elif _read(path) != data:
                _put_back(path, data)
        return sorted(changed & own)


class Untouched:
    """In place of a Snapshot where the kernel's process cannot write the repo (a re-gate under
    the sandbox): whatever changes during the run is someone else's, a user committing while
    verify.py re-gates, and putting the repo back would undo their work."""

    def restore(self, but=None):
        return []


def _put_back(path, data):
    """The file's bytes as the snapshot holds them (written aside, then moved in place)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(path + ".autokernel-restore")
    tmp.write_bytes(data)
    tmp.replace(path)


def _rel(path, root):
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(path)


def recover(path=SNAPSHOT_PATH):
    """The crash record of a bench.py killed mid-run: checked, restored but for its candidate,
    and its CRASH row appended. Returns the lines to show (None when there is no record)."""
    if not Path(path).exists():
        return None
    try:
        snapshot, data = Snapshot.load(path)
        refused = untrusted(snapshot, data)
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as e:
        snapshot, data, refused = None, {}, f"it cannot be read ({one_line(e)})"
    if refused:
        aside = Path(path).with_name(f"refused-{time.strftime('%Y%m%d-%H%M%S')}.json")
        Path(path).replace(aside)
        lines = [f"the crash record of a killed bench.py is refused and not applied: {refused} "
                 f"(kept as {_rel(aside, ROOT)}; check the repo with `git status`)"]
    else:
        changed = snapshot.restore(but=data.get("candidate"))
        Path(path).unlink()
        lines = [f"a bench.py killed mid-run left changes; restored: "
                 f"{', '.join(changed) or 'nothing'}"]
    row, where = data.get("crash_row"), data.get("results")
    if isinstance(row, dict) and where:
        try:
            rows = results.read_rows(where)
            results.append_row(crash_row(row, len(rows) + 1), where)
            lines.append(f"experiment {len(rows) + 1} recorded as CRASH: {KILLED}")
        except (UsageError, OSError) as e:
            lines.append(f"the killed run's CRASH row was not recorded ({one_line(e)})")
    return lines


def crash_row(row, experiment):
    """The killed run's row, from what its record says about the run (nothing it may claim
    about an outcome: no time, no keep)."""
    said = {k: row.get(k, "") for k in ("tag", "kernel_type", "description", "timestamp",
                                         "shape", "dtype", "device", "kernel_sha256")}
    return dict(said, experiment=experiment, correctness="CRASH", reason=KILLED,
                status="revert" if row.get("status") == "revert" else "judged")


def untrusted(snapshot, data):
    """Why a crash record must not be applied, or None. Whoever wrote it, it may only take the
    night back: it holds no row results.tsv lacks, and every commit it would put back on the
    branch is one its rows name (a keep)."""
    if Path(snapshot.root).resolve() != ROOT.resolve():
        return f"it is another repo's ({snapshot.root})"
    where = data.get("results")
    if where:
        held, now = snapshot.files.get(where, b""), _read(where) or b""
        if not now.startswith(held):
            return f"it holds rows {_rel(where, ROOT)} does not have"
        kept = results.commits_named(held)
    else:
        kept = set()
    head = data.get("head")
    if head:
        if git("cat-file", "-e", f"{head}^{{commit}}", cwd=snapshot.root).returncode != 0:
            return f"its HEAD {head[:12]} is not a commit"
        if _head_of(snapshot) != head:
            return "its HEAD disagrees with the refs it holds"
        ahead = git("rev-list", head, "--not", "HEAD", cwd=snapshot.root).stdout.split()
        unnamed = [c for c in ahead if not any(c.startswith(k) for k in kept)]
        if unnamed:
            return f"it would put commit {unnamed[0][:12]} on the branch, which no row names"
    return None


def _head_of(snapshot):
    """The commit the snapshot's .git/HEAD leads to (through its refs), or None."""
    gitdir = Path(snapshot.root) / ".git"
    text = (snapshot.files.get(str(gitdir / "HEAD")) or b"").decode(errors="replace").strip()
    if not text.startswith("ref: "):
        return text or None
    ref = text[5:]
    loose = snapshot.files.get(str(gitdir / ref))
    if loose:
        return loose.decode(errors="replace").strip()
    for line in (snapshot.files.get(str(gitdir / "packed-refs")) or b"").decode().splitlines():
        sha, _, name = line.partition(" ")
        if name == ref:
            return sha
    return None


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
