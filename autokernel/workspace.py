"""
The files the scripts hand each other under workspace/: the JSON files (one reader and one writer
each) and the plan's kernel files.

    profile.json      profile.py -> extract.py, verify.py (the model's flags), analysis
                      {"model", "model_args", "device", "dtype", "input_shapes", "total_op_us",
                       "entries": [{"kernel_type" | "group", "share", "shapes", ...}], ...}
    plan.json         extract.py -> orchestrate.py, verify.py, analysis.py
                      {"model", "created", "profile", "device", "dtype", "input_shapes",
                       "total_op_us", "kernels": [{"name", "kernel_type", "file", "share",
                       "shapes", "rank", "bound", "amdahl_ceiling", ...}]}
    orchestrate.json  orchestrate.py's cache of the visits (see orchestrate.py); night_kernel
                      reads its current kernel for bench.py
    verify.json       verify.py's report (see autokernel/verify_report.py)
    prepare.json      prepare.py's cache of ceilings and baseline times (autokernel.baselines)
    <name>.py         a plan kernel's file of record (plan.json's "file"), written only by
                      write_kernel_file: its starter with the model's shapes (extract.py), its
                      kept version (bench.py's keep), HEAD's kernel.py when orchestrate.py
                      switches to another kernel

Writes are atomic (a temporary file, then a rename): a kill mid-write never leaves half a file.
"""
import json
from pathlib import Path

import autokernel as ak
from autokernel import KERNEL_TYPE_NAMES, PLAN_JSON, PROFILE_JSON
from autokernel.cli import UsageError
from autokernel.results import rel


def write_json(path, data, indent=1):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=indent) + "\n")
    tmp.replace(path)


def write_kernel_file(path, content):
    """A plan kernel's file of record (workspace/<name>.py), text or bytes, written atomically:
    its only writer, for extract.py, bench.py's keep and orchestrate.py's switch."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(content.encode() if isinstance(content, str) else content)
    tmp.replace(path)


def read_json(path, missing_hint, what):
    """A JSON object from path; a missing or unreadable file is a UsageError that says what to
    run (missing_hint) and what the file should have been (what)."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{rel(path)} not found: {missing_hint}")
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{rel(path)} is not valid JSON ({' '.join(str(e).split())}): "
                         f"{missing_hint}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{rel(path)} is not {what}: {missing_hint}")
    return data


# ---- profile.json ---------------------------------------------------------------------------

def read_profile(path=PROFILE_JSON):
    profile = read_json(path, "run `uv run profile.py` first", "a profile.py output")
    if not isinstance(profile.get("entries"), list):
        raise UsageError(f"{rel(path)} is not a profile.py output: run `uv run profile.py` again")
    return profile


def recorded_model_args(path=PROFILE_JSON) -> dict:
    """The model flags profile.py recorded ({} when there is no readable profile)."""
    try:
        return read_profile(path).get("model_args") or {}
    except UsageError:
        return {}


# ---- plan.json ------------------------------------------------------------------------------

PLAN_HINT = "run `uv run profile.py` and `uv run extract.py` first"


def read_plan(path=PLAN_JSON):
    """plan.json, checked: every kernel has a unique name, a known type (or "region"), a file
    and a share."""
    plan = read_json(path, PLAN_HINT, "an extract.py plan")
    kernels = plan.get("kernels")
    if not kernels or not isinstance(kernels, list):
        raise UsageError(f"{rel(path)} lists no kernels: re-run `uv run extract.py`")
    seen = set()
    for i, k in enumerate(kernels):
        missing = [f for f in ("name", "kernel_type", "file", "share")
                   if not isinstance(k, dict) or f not in k]
        if missing:
            raise UsageError(f"{rel(path)}: kernel #{i + 1} lacks {', '.join(missing)}: "
                             f"re-run `uv run extract.py`")
        if k["kernel_type"] not in KERNEL_TYPE_NAMES and k["kernel_type"] != "region":
            raise UsageError(f"{rel(path)}: kernel {k['name']!r} has unknown type "
                             f"{k['kernel_type']!r}: re-run `uv run extract.py`")
        if not isinstance(k["share"], (int, float)) or not 0 <= k["share"] <= 1:
            raise UsageError(f"{rel(path)}: kernel {k['name']!r} share {k['share']!r} is not a "
                             f"fraction in [0, 1]: re-run `uv run extract.py`")
        if k["name"] in seen:
            raise UsageError(f"{rel(path)}: kernel name {k['name']!r} appears twice: re-run "
                             f"`uv run extract.py`")
        seen.add(k["name"])
    if sum(k["share"] for k in kernels) > 1.0 + 1e-6:
        raise UsageError(f"{rel(path)}: the kernels' shares add up to more than 1: re-run "
                         f"`uv run extract.py`")
    return plan


def plan_kernels(plan) -> dict:
    """name -> the plan's entry for it, in plan order."""
    return {k["name"]: k for k in plan["kernels"]}


def night_kernel():
    """The plan's entry for the kernel the night is on: orchestrate.py's current kernel (the
    last visit in orchestrate.json, written for this plan.json). None without a night: no
    readable plan.json or orchestrate.json, no visit yet, or the visits of an earlier plan."""
    try:
        plan = read_plan(ak.PLAN_JSON)
        state = read_json(ak.ORCHESTRATE_JSON, "run `uv run orchestrate.py next`", "a visits file")
        if state.get("plan_created") != plan.get("created"):
            return None
        return plan_kernels(plan).get(state["visits"][-1]["kernel"])
    except (UsageError, KeyError, IndexError, TypeError, AttributeError):
        return None
