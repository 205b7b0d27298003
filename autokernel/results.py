"""
results.tsv, the night's record: its schema, its one reader and one writer, and the keep rule.

Every experiment bench.py judges is one row, appended and flushed to disk before any git action,
so the file and the commits never disagree. Nothing ever rewrites a row. bench.py refuses to judge
on a malformed file (one line naming the line and what to do) rather than guess.

Columns: the seed's ten first, in this order, then ours:
    experiment, tag, kernel_type, throughput_tflops, latency_us, pct_peak, speedup_vs_pytorch,
    correctness (PASS FAIL TIMEOUT CRASH), peak_vram_mb, description,
    bandwidth_gb_s, speedup_vs_compile, status (keep revert judged), commit, timestamp, shape,
    dtype, device, timing_valid, reason, kernel_sha256 (the judged file's bytes), best_us (the best
    kept version, timed in the same run), noise_pct (the paired rounds' spread)
"""
import csv
import math
import os
import re
import statistics
from pathlib import Path

from autokernel import RESULTS_TSV, ROOT
from autokernel.cli import UsageError

SEED_COLUMNS = [
    "experiment", "tag", "kernel_type", "throughput_tflops", "latency_us", "pct_peak",
    "speedup_vs_pytorch", "correctness", "peak_vram_mb", "description",
]
EXTRA_COLUMNS = [
    "bandwidth_gb_s", "speedup_vs_compile", "status", "commit", "timestamp",
    "shape", "dtype", "device", "timing_valid", "reason", "kernel_sha256", "best_us",
    "noise_pct",
]
COLUMNS = SEED_COLUMNS + EXTRA_COLUMNS
CORRECTNESS_VALUES = ("PASS", "FAIL", "TIMEOUT", "CRASH")
STATUS_VALUES = ("keep", "revert", "judged")  # judged: no git action (--no-git, --quick, refused)
SETTING_COLUMNS = ("tag", "shape", "dtype", "device")  # latencies compare only within a setting


def rel(path) -> str:
    path = Path(path)
    try:
        return str(path.resolve().relative_to(ROOT.resolve()))
    except ValueError:
        return str(path)


# ---- reading --------------------------------------------------------------------------------

def read_rows(path=RESULTS_TSV, must_exist=False) -> list:
    """The rows as dicts of strings, in file order ([] when the file is missing). Anything
    malformed raises UsageError naming the line: the file is never rewritten, only appended to."""
    path = Path(path)
    if not path.exists():
        if must_exist:
            raise UsageError(f"{rel(path)} not found: run `uv run bench.py` first")
        return []
    if path.stat().st_size == 0:
        raise UsageError(f"{rel(path)} is empty (not even a header): delete it and let "
                         f"`uv run bench.py` write a new one")
    try:
        with open(path, newline="") as f:
            table = list(csv.reader(f, delimiter="\t"))
    except (csv.Error, UnicodeDecodeError, OSError) as e:
        raise UsageError(f"{rel(path)} is malformed ({' '.join(str(e).split())}); fix it or "
                         f"move it aside")
    header = table[0] if table else []
    if header != COLUMNS:
        at = next((i for i, (a, b) in enumerate(zip(header, COLUMNS)) if a != b),
                  min(len(header), len(COLUMNS)))
        raise UsageError(
            f"{rel(path)} is malformed: its header differs from bench.py's columns at column "
            f"{at + 1} ({header[at] if at < len(header) else 'missing'!r} vs "
            f"{COLUMNS[at] if at < len(COLUMNS) else 'nothing'!r}); move it aside "
            f"(an older format?) and let bench.py start a new one")
    rows = []
    for number, fields in enumerate(table[1:], start=2):
        if len(fields) != len(COLUMNS):
            raise UsageError(f"{rel(path)} is malformed: line {number} has {len(fields)} fields, "
                             f"expected {len(COLUMNS)}; fix that line or move the file aside")
        row = dict(zip(COLUMNS, fields))
        if row["correctness"] not in CORRECTNESS_VALUES or row["status"] not in STATUS_VALUES:
            raise UsageError(f"{rel(path)} is malformed: line {number} has correctness "
                             f"{row['correctness']!r} and status {row['status']!r}; fix that line "
                             f"or move the file aside")
        rows.append(row)
    return rows


def commits_named(data: bytes) -> set:
    """The commits results.tsv's bytes name (its keeps), read leniently: a crash record's copy
    is checked with it, and a line that does not parse names nothing."""
    at = COLUMNS.index("commit")
    lines = csv.reader(data.decode(errors="replace").splitlines()[1:], delimiter="\t")
    return {fields[at] for fields in lines if len(fields) == len(COLUMNS) and fields[at]}


def setting(row) -> tuple:
    """What makes two latencies comparable: the same tag, shape, dtype and device."""
    return tuple(row[c] for c in SETTING_COLUMNS)


def kept_rows(rows, key) -> list:
    """The kept PASS rows of one setting, in file order."""
    return [r for r in rows if r["status"] == "keep" and r["correctness"] == "PASS"
            and setting(r) == key]


def best_kept(rows, key):
    """The kept row of this setting with the lowest latency (the version a candidate must beat),
    else None. Each keep beats the kept version it was timed against, so this is also the
    latest keep, barring noise between runs."""
    best = None
    for row in kept_rows(rows, key):
        try:
            latency = float(row["latency_us"])
        except ValueError:
            raise UsageError(f"results.tsv is malformed: experiment {row['experiment']} is kept "
                             f"but its latency_us {row['latency_us']!r} is not a number; fix it")
        if best is None or latency < float(best["latency_us"]):
            best = row
    return best


# ---- writing --------------------------------------------------------------------------------

def clean_text(text, limit=400) -> str:
    """One line, no tabs or control characters: safe in a TSV cell."""
    text = re.sub(r"[\t\r\n\x00-\x1f]+", " ", str(text)).strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."


def number(x, digits) -> str:
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def append_row(row, path=RESULTS_TSV):
    """Append one row (a dict over COLUMNS; missing keys are empty), with the header when the file
    is new, and fsync it: once this returns the row survives a crash or a kill."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    with open(path, "a", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        if new:
            writer.writerow(COLUMNS)
        writer.writerow([clean_text(row.get(c, "")) for c in COLUMNS])
        f.flush()
        os.fsync(f.fileno())


def check_writable(path=RESULTS_TSV):
    """Raise UsageError unless a row could be appended to path (checked before judging, so an
    unwritable file never ends with a commit and no row)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        with open(path, "a"):
            pass
        if not existed:
            path.unlink()
    except OSError as e:
        raise UsageError(f"{rel(path)} is not writable ({e.strerror or e}): fix its permissions "
                         f"or pass --results PATH")


# ---- the keep rule --------------------------------------------------------------------------

NOISE_FLOOR = 0.01  # a gain under 1% is never told apart from noise
RECORD_MARGIN = 0.05  # against a number from another run: run-to-run drift counts as noise too
# A kept version reading this much slower than its own record had its windows disturbed (work a
# candidate's process left running on the GPU can do that): its record decides instead.
KEPT_SLOWED = 0.10


def keep_rule(candidate_us, kept_us):
    """Whether a correct candidate replaces the kept version, from paired rounds (round i timed
    both, in alternating order, on the same inputs in the same run). -> (keep, gain, noise, why).

    gain = 1 - median over rounds of candidate/kept; noise = the spread (max - min) of those
    ratios, never below NOISE_FLOOR. Keep only when gain > noise: an edit that changes nothing
    has a median ratio inside its own spread, however the noise falls. With no kept version yet (the first
    correct run of this tag, shape, dtype and device) the candidate is kept."""
    if not kept_us:
        return True, None, None, "the first correct version of this setting"
    ratios = sorted(c / k for c, k in zip(candidate_us, kept_us) if k > 0)
    if not ratios:
        return False, None, None, "the kept version's time is not a number"
    mid = len(ratios) // 2
    median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
    gain, noise = 1.0 - median, max(NOISE_FLOOR, ratios[-1] - ratios[0])
    rounds = f"{noise:.1%} noise of {len(ratios)} paired rounds"
    if gain > noise:
        return True, gain, noise, f"{gain:.1%} faster than the kept version, beyond the {rounds}"
    if gain < -noise:
        return False, gain, noise, f"{-gain:.1%} slower than the kept version (beyond the {rounds})"
    which = f"{gain:.1%} faster" if gain >= 0 else f"{-gain:.1%} slower"
    return False, gain, noise, f"{which} than the kept version (the median round), within the " \
                               f"{rounds}"


def keep_rule_checked(candidate_us, kept_us, recorded_us=None):
    """keep_rule, unless the kept version ran more than KEPT_SLOWED slower than its recorded
    latency in these rounds: then a gain over it proves nothing, and the candidate must beat
    the record by RECORD_MARGIN as well. -> (keep, gain, noise, why)."""
    verdict = keep_rule(candidate_us, kept_us)
    if not (verdict[0] and kept_us and recorded_us):
        return verdict
    slowed = statistics.median(kept_us) / recorded_us - 1.0
    if slowed <= KEPT_SLOWED:
        return verdict
    return keep_rule_against_record(candidate_us, recorded_us,
                                    f"was timed (it read {slowed:.0%} above its record in these "
                                    f"rounds: its windows were disturbed)")


def keep_rule_against_record(candidate_us, recorded_us, why):
    """The keep rule when the kept version's record decides (why, after "the kept version": it
    could not be timed beside the candidate, because it no longer imports, its source is gone or
    it failed its windows; or keep_rule_checked's case): the candidate must beat the kept
    version's recorded latency by RECORD_MARGIN. A kept version that cannot be run never lets a
    candidate through unmeasured. -> (keep, gain, noise, why)."""
    gain = 1.0 - statistics.median(candidate_us) / recorded_us
    against = f"the kept version {why}, so against its recorded {recorded_us:.1f} us"
    if gain > RECORD_MARGIN:
        return True, gain, RECORD_MARGIN, f"{gain:.1%} faster: {against}"
    return False, gain, RECORD_MARGIN, f"{gain:+.1%}, not beyond {RECORD_MARGIN:.0%}: {against}"
