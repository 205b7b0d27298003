"""
The morning re-check: before verify.py plugs a kernel file into the model, the file goes through
the gate's correctness again (bench.py --correctness-only: the five stages on fresh inputs, the
untrusted child; no timing and no baselines, which the morning report does not use: verify.py
times the model itself) and, for the night's kernels, its bytes must be those of a kept row of
results.tsv. A forged results.tsv or a file edited after its keep never reaches the morning
report. The files' gates run side by side (a re-gate records nothing, so bench.py lets them
share its lock), half the CPU's cores' worth at once: the morning waits for the slowest file,
not for the sum.
"""
import os
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autokernel import ROOT, WORKSPACE
from autokernel.cli import one_line
from autokernel.results import rel
from autokernel.state import digest


HEARTBEAT_S = 30  # the longest a re-gate, or a long step of verify.py, stays silent


def parallel_limit():
    """How many re-gates run at once: each is a judge and a child compiling kernels, mostly on
    the CPU (the GPU checks are short), so half the cores, leaving the compilers room; at most
    four, since each also holds two CUDA contexts and its checks' tensors on the one GPU."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


def regate(path, timeout_s=180, log=None):
    """(passed, one line) for one kernel file judged by bench.py --correctness-only."""
    return run_gates([path], timeout_s, log)[str(path)]


class Gate:
    """One bench.py --correctness-only (no row, no git; a scratch results file all the same),
    its stage lines relayed as they come."""

    def __init__(self, path, scratch, timeout_s):
        self.path, self.name, self.started = str(path), Path(path).name, time.monotonic()
        self.lines, self.pending, self.last, self.said = [], b"", "the gate started", self.started
        here = Path(scratch) / f"{len(list(Path(scratch).iterdir()))}"
        here.mkdir()
        cmd = [sys.executable, str(ROOT / "bench.py"), "--kernel", self.path,
               "--correctness-only", "--results", str(here / "results.tsv"),
               "--timeout", str(timeout_s)]
        env = dict(os.environ, AUTOKERNEL_WORKSPACE=str(WORKSPACE))  # this run's, moved or not
        self.err = open(here / "stderr", "w+")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=self.err)

    def read(self):
        """The stage lines that came since the last read; self.done once the gate is over."""
        chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
        *done, self.pending = (self.pending + chunk).split(b"\n")
        self.done = not chunk
        if self.done:  # its last line may lack a newline
            done.append(self.pending)
        out = []
        for line in (x.decode(errors="replace") for x in done):
            self.lines.append(line)
            if line.startswith("stage_"):
                out.append(line)
                self.said, self.last = time.monotonic(), line.split(":")[0]
        return out

    def heartbeat(self):
        """A line when the gate has been silent for HEARTBEAT_S, else None."""
        now = time.monotonic()
        if now - self.said < HEARTBEAT_S:
            return None
        line = f"... still checking: {now - self.said:.0f} s since {self.last}"
        self.said = now
        return line

    def verdict(self):
        """(passed, one line), once the gate is done."""
        self.proc.stdout.close()
        code = self.proc.wait()
        self.err.seek(0)
        stderr = self.err.read()
        self.err.close()
        keys = dict(line.split(": ", 1) for line in self.lines if ": " in line)
        if code != 0 or "correctness" not in keys:
            return False, f"the gate refused to judge it: {one_line(stderr) or 'no output'}"
        if keys["correctness"] != "PASS":
            return False, f"{keys['correctness']}: {keys.get('reason', '')}"
        return True, "PASS (the correctness stages; not timed)"


def run_gates(paths, timeout_s=180, log=None, at_once=None, done=None):
    """{path: (passed, one line)} for kernel files each judged by a bench.py --correctness-only
    of its own, up to `at_once` (parallel_limit()) side by side. log: gets each stage's line as
    a gate prints it (after the file's name when several run), and a line for a gate silent for
    HEARTBEAT_S; done(path, passed, line, seconds): called as each gate ends."""
    log, done = log or (lambda line: None), done or (lambda *a: None)
    waiting, running, verdicts = [str(p) for p in paths], {}, {}
    at_once = at_once or parallel_limit()
    named = (lambda gate, line: f"{gate.name}: {line}") if len(waiting) > 1 else \
        (lambda gate, line: line)
    with tempfile.TemporaryDirectory(prefix="autokernel_regate_") as scratch, \
            selectors.DefaultSelector() as sel:
        while waiting or running:
            while waiting and len(running) < at_once:
                gate = Gate(waiting.pop(0), scratch, timeout_s)
                sel.register(gate.proc.stdout, selectors.EVENT_READ, gate)
                running[gate.path] = gate
            for key, _ in sel.select(HEARTBEAT_S / 3):
                gate = key.data
                for line in gate.read():
                    log(named(gate, line))
                if gate.done:
                    sel.unregister(gate.proc.stdout)
                    del running[gate.path]
                    verdicts[gate.path] = gate.verdict()
                    done(gate.path, *verdicts[gate.path], time.monotonic() - gate.started)
            for gate in running.values():
                line = gate.heartbeat()
                if line:
                    log(named(gate, line))
    return verdicts


def kept_version(path, tag, rows):
    """Which kept row of results.tsv this file is: (ok, one line). ok is False when the file
    matches no kept row of its tag (edited after its keep, or a forged row), None when the tag
    has no kept row at all (the starter extract.py wrote)."""
    keeps = [r for r in rows if r["tag"] == tag and r["status"] == "keep"
             and r["correctness"] == "PASS"]
    if not keeps:
        return None, "no kept version in results.tsv: this is the starter as extract.py wrote it"
    sha = digest(Path(path).read_bytes())  # the hash bench.py wrote into the row
    match = [r for r in keeps if r["kernel_sha256"] == sha]
    if not match:
        return False, (f"{rel(path)} matches no kept row of {tag} in results.tsv (edited after "
                       f"its keep, or the row is not bench.py's)")
    row = match[-1]
    older = "" if row is keeps[-1] else f" (an older keep; the latest is experiment " \
                                        f"{keeps[-1]['experiment']})"
    return True, (f"kept version of experiment {row['experiment']}, commit {row['commit']}, "
                  f"{row['latency_us']} us{older}")


def check_all(specs, rows=None, log=None):
    """specs: [(path, tag)]; rows: results.tsv's rows for the night's kernels (None: no kept-row
    check). Each file whose bytes may be judged goes through its gate, side by side with the
    others (run_gates). Returns {path: {"passed", "gate", "version", "version_ok"}}, logging
    progress."""
    log = log or (lambda line: print(line, flush=True))
    first = time.monotonic()
    versions = {str(path): kept_version(path, tag, rows) if rows is not None else (None, "")
                for path, tag in specs}
    judged = [str(path) for path, _ in specs if versions[str(path)][0] is not False]
    for path, (ok, version) in versions.items():
        if ok is False:
            log(f"  {rel(path)}: not judged: {version}")
    if judged:
        at_once = min(parallel_limit(), len(judged))
        log(f"re-gating {len(judged)} kernel file(s), {at_once} at a time: the five correctness "
            f"stages on fresh inputs, each file in a judge and a sandboxed child of its own ...")
    ended = []

    def done(path, passed, gate, seconds):
        ended.append(path)
        version = versions[path][1]
        log(f"  {rel(path)}: {gate} ({seconds:.0f} s)" + (f"; {version}" if version else "")
            + f" [{len(ended)} of {len(judged)} done, {time.monotonic() - first:.0f} s into "
              f"the re-gates]")
    verdicts = run_gates(judged, log=lambda line: log(f"  {line}"), done=done)
    out = {}
    for path, _ in specs:
        version_ok, version = versions[str(path)]
        passed, gate = verdicts.get(str(path), (False, "not judged"))
        out[str(path)] = {"passed": passed and version_ok is not False, "gate": gate,
                          "version": version, "version_ok": version_ok}
    return out


def unbacked_keeps(rows, kernel_rel="kernel.py"):
    """Kept rows that git does not back: [(row, why)]. A kept row names the commit that holds the
    judged kernel.py and that file's sha256; a row whose commit is gone, or holds other bytes,
    was not written by this repo's bench.py (or the history was rewritten since)."""
    from autokernel import git
    out = []
    for row in rows:
        if row["status"] != "keep":
            continue
        source = git.git("show", f"{row['commit']}:{kernel_rel}").stdout.encode() \
            if row["commit"] else None
        if not source:
            out.append((row, f"its commit {row['commit'] or '(none)'} is not in this repo"))
        elif row["kernel_sha256"] and digest(source) != row["kernel_sha256"]:
            out.append((row, f"commit {row['commit']} holds another {kernel_rel} than the one "
                             f"judged"))
    return out
