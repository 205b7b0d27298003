"""
The morning re-check: before verify.py plugs a kernel file into the model, the file goes through
the gate's correctness again (bench.py --correctness-only: the five stages on fresh inputs, the
untrusted child; no timing and no baselines, which the morning report does not use: verify.py
times the model itself) and, for the night's kernels, its bytes must be those of a kept row of
results.tsv. A forged results.tsv or a file edited after its keep never reaches the morning
report.
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


def regate(path, timeout_s=180, log=None):
    """(passed, one line) for a kernel file judged by bench.py --correctness-only (no row, no
    git; a scratch results file all the same). log: gets each stage's line as the gate prints
    it, and a line every HEARTBEAT_S while a stage runs."""
    log = log or (lambda line: None)
    with tempfile.TemporaryDirectory(prefix="autokernel_regate_") as scratch:
        cmd = [sys.executable, str(ROOT / "bench.py"), "--kernel", str(path),
               "--correctness-only", "--results", str(Path(scratch) / "results.tsv"),
               "--timeout", str(timeout_s)]
        env = dict(os.environ, AUTOKERNEL_WORKSPACE=str(WORKSPACE))  # this run's, moved or not
        with open(Path(scratch) / "stderr", "w+") as err:
            lines, code = relayed(cmd, env, err, log)
            err.seek(0)
            stderr = err.read()
    keys = dict(line.split(": ", 1) for line in lines if ": " in line)
    if code != 0 or "correctness" not in keys:
        return False, f"the gate refused to judge it: {one_line(stderr) or 'no output'}"
    if keys["correctness"] != "PASS":
        return False, f"{keys['correctness']}: {keys.get('reason', '')}"
    return True, "PASS (the correctness stages; not timed)"


def relayed(cmd, env, err, log):
    """Run the gate, passing its stage lines to log as they come (and how long the current
    stage has run, when it is silent for HEARTBEAT_S). -> (its stdout lines, exit code)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err)
    lines, pending, since, last = [], b"", time.monotonic(), "the gate started"
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            if not sel.select(HEARTBEAT_S):
                log(f"... still checking: {time.monotonic() - since:.0f} s since {last}")
                continue
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
            *done, pending = (pending + chunk).split(b"\n")
            if not chunk:  # the gate is done; its last line may lack a newline
                done.append(pending)
            for line in (x.decode(errors="replace") for x in done):
                lines.append(line)
                if line.startswith("stage_"):
                    log(line)
                    since, last = time.monotonic(), line.split(":")[0]
            if not chunk:
                break
    proc.stdout.close()
    return lines, proc.wait()


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
    check). Returns {path: {"passed", "gate", "version", "version_ok"}}, logging progress."""
    log = log or (lambda line: print(line, flush=True))
    out, first = {}, time.monotonic()
    for i, (path, tag) in enumerate(specs, start=1):
        started = time.monotonic()
        left = f", {len(specs) - i} more after it" if i < len(specs) else ""
        log(f"re-gating {i}/{len(specs)}: {rel(path)}: the five correctness stages{left} "
            f"({started - first:.0f} s into the re-gates) ...")
        version_ok, version = kept_version(path, tag, rows) if rows is not None else (None, "")
        passed, gate = (False, "not judged") if version_ok is False else \
            regate(path, log=lambda line: log(f"  {line}"))
        log(f"  {gate} ({time.monotonic() - started:.0f} s)" + (f"; {version}" if version else ""))
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
