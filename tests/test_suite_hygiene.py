"""Rules for the suite itself: a test that asserts on how long something took fails whenever the
machine is busy (CI's 2 cores, a contributor's laptop), so speed belongs in benchmarks/."""
import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CLOCKS = {"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns",
          "process_time", "process_time_ns", "getrusage", "thread_time"}


def clock_name(node):
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
        return name if name in CLOCKS else None
    return None


def is_time(node, timed):
    """An expression that is a clock reading or arithmetic on one (`end - start`)."""
    if clock_name(node) or (isinstance(node, ast.Name) and node.id in timed):
        return True
    if isinstance(node, ast.BinOp):
        return is_time(node.left, timed) or is_time(node.right, timed)
    return isinstance(node, ast.Attribute) and node.attr in {"ru_utime", "ru_stime"}


def timing_asserts(function):
    """Line numbers of asserts in one test function that compare a clock reading."""
    timed, lines = set(), []
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and is_time(node.value, timed):
            timed |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    for node in ast.walk(function):
        if isinstance(node, ast.Assert):
            compares = [c for c in ast.walk(node.test) if isinstance(c, ast.Compare)]
            if any(is_time(side, timed) for c in compares for side in [c.left, *c.comparators]):
                lines.append(node.lineno)
    return lines


def test_no_test_asserts_on_elapsed_time():
    offenders = []
    for path in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                offenders += [f"{path.name}:{line}" for line in timing_asserts(node)]
    assert not offenders, f"assertions on elapsed time (move them to benchmarks/): {offenders}"
