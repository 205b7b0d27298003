"""
KernelBench problems behind the gate: a problem file in KernelBench's format (`Model`,
`get_inputs()`, `get_init_inputs()`) and a solution in its convention (`ModelNew`, built from
Model's init arguments, with Model's forward) judged like any kernel file, so solutions move
between the two unchanged. kernelbench.py is the CLI (setup, score); autokernel/kernelbench_score
scores a folder.

The kernel file (kernel.py after `kernelbench.py setup`, or a solution being scored):
    class ModelNew(nn.Module): ...            # the solution, as KernelBench takes it
    KERNEL_TYPE = "kernelbench"
    KERNEL_NAME = "kb_23_Softmax"             # optional: the tag in results.tsv
    KERNELBENCH_PROBLEM = "path/to/23_Softmax.py"
    KERNELBENCH_SHA256 = "..."                # the problem's bytes: a changed problem is refused
    BENCH_DTYPE = "fp32"                      # optional: the judged and timed dtype (default
                                              #   fp32, KernelBench's precision)

Parameters. The judge builds Model and the child builds ModelNew the way KernelBench does: seed,
get_init_inputs(), seed again, the constructor on the CPU in fp32, then .to(device, dtype). Both
draw the same random numbers in the same order, so a ModelNew that creates Model's parameters
(any names or layout; KernelBench asks for nothing more) gets Model's values. The judge never
takes the child's parameters on trust: they matter only through the outputs it checks. Sending
Model's state_dict instead would demand Model's own parameter names of every solution.

The oracle, per dtype (decided once per problem by a probe, and said in the stage log):
  * "float64": a float64 copy of Model (parameters and inputs rounded to the dtype first, as
    the candidate gets them), when Model runs in float64 and Model itself in the dtype is within
    the dtype's tolerance of it;
  * "model": Model in the dtype itself, KernelBench's own comparison, for the judged dtype when
    Model does not run in float64 or misses that tolerance itself;
  * another dtype where Model misses its tolerance is not judged (the problem does not allow it).
Values are compared with the gate's rule (autokernel.mismatches: the dtype's rtol, atol in units
of the output's RMS), a chunk at a time: KernelBench's level-1 outputs reach GBs, and a float64
copy of one twice that. Integer outputs (argmax) must be equal.

The stages: smoke (2 input sets), sweep (in each judged dtype, 2 models x 2 input sets, every
one from fresh seeds), stability (signed, large and offset inputs: a case counts only where
Model itself in that dtype passes it), determinism (3 calls, bitwise equal), and no edge stage:
a problem fixes its shapes. The honesty checks are the gate's: the child's dispatch guard refuses
torch compute ops in ModelNew.forward (so the heavy work can be handed neither to torch nor to
Model), outputs go into the judge's buffers, inputs must come back bit for bit (checked against
the same seed's inputs made again, not against a copy held in GPU memory), an output reused or
identical to the last call's while wrong is named a cached result, and the timing is the judge's.
"""
import contextlib
import copy
import functools
import inspect
import math
import os
from pathlib import Path

import torch

import autokernel as ak
from autokernel import gate, state
from autokernel.baselines import full_fp32
from autokernel.cli import describe
from autokernel.contract import KernelFileError, load_module, tag_of
from autokernel.timing import Case, TimingError

DEFAULT_DTYPE = "fp32"          # KernelBench's precision
SWEEP_MODELS = 2                # models per judged dtype in the sweep, each with 2 input sets
CHUNK = 1 << 24                 # elements compared at once (a float64 chunk: 128 MB)
SAMPLE = 1024                   # output elements kept to recognise a cached result
BUILD_FAILED = "ModelNew(*get_init_inputs()) raised"


class ProblemError(KernelFileError):
    """The problem file itself is unusable (not the solution's fault)."""


def stability_cases(dtype):
    """(label, transform of a floating input in fp32): inputs that break what get_inputs' rand
    and randn let through: code that assumes non-negative inputs (signed), a missing
    max-subtraction (large), a variance taken as E[x^2] - E[x]^2 (offset)."""
    big = 100 if dtype == torch.float16 else 1000  # squares of 1000 overflow fp16
    return (("signed inputs (2x - 1)", lambda x: x * 2 - 1),
            (f"large inputs (x * {big})", lambda x: x * big),
            ("offset inputs (x + 100)", lambda x: x + 100))


def fresh_seed():
    return int.from_bytes(os.urandom(4), "little")


def judged_dtypes():
    """The dtypes a problem can be judged in here: the CPU interpreter computes bf16 tl.dot
    wrongly, so a CPU judges fp32 and fp16 only."""
    return ["fp32", "fp16", "bf16"] if ak.CUDA else ["fp32", "fp16"]


# ---- the problem ----------------------------------------------------------------------------

class Problem:
    """A KernelBench problem file, imported in the judge's process: it is the user's oracle,
    trusted like autokernel/reference.py (the solution never runs here)."""

    def __init__(self, path):
        self.path = Path(path).resolve()
        self.name = self.path.stem
        if self.path.suffix != ".py":
            raise ProblemError(f"{path} is not a Python file: pass a KernelBench problem (a .py "
                               f"file with Model, get_inputs, get_init_inputs)")
        try:
            self.sha256 = state.digest(self.path.read_bytes())
        except OSError as e:
            raise ProblemError(f"problem file {path} cannot be read ({describe(e)})") from None
        try:
            module = load_module(self.path)
        except Exception as e:
            raise ProblemError(f"problem {self.name}: importing it raised {describe(e)}") \
                from None
        self.Model = getattr(module, "Model", None)
        self.get_inputs = getattr(module, "get_inputs", None)
        self.get_init_inputs = getattr(module, "get_init_inputs", None)
        missing = [n for n, ok in (("class Model(nn.Module)", isinstance(self.Model, type)
                                    and issubclass(self.Model, torch.nn.Module)),
                                   ("get_inputs()", callable(self.get_inputs)),
                                   ("get_init_inputs()", callable(self.get_init_inputs)))
                   if not ok]
        if missing:
            raise ProblemError(f"{self.path.name} is not a KernelBench problem: it defines no "
                               f"{', '.join(missing)}")
        self.arg_names = forward_names(self.Model)

    def build(self, seed, dtype):
        """(Model on the device in dtype, its init arguments), as the child builds ModelNew."""
        init_args = self.init_args(seed, dtype)
        try:
            with torch.no_grad():
                torch.manual_seed(seed)
                model = self.Model(*init_args).to(device=ak.DEVICE, dtype=dtype)
        except Exception as e:
            raise ProblemError(f"problem {self.name}: Model(*get_init_inputs()) raised "
                               f"{describe(e)}") from None
        return model, init_args

    def init_args(self, seed, dtype):
        torch.manual_seed(seed)
        try:
            return [cast(v, dtype) for v in self.get_init_inputs()]
        except Exception as e:
            raise ProblemError(f"problem {self.name}: get_init_inputs() raised "
                               f"{describe(e)}") from None

    def inputs(self, seed, dtype, transform=None):
        """get_inputs() under `seed`, made on the device, floating tensors in dtype (and
        transformed, for the stability stage), named after Model.forward's arguments. The same
        seed gives the same bits again: that is how the judge checks inputs came back intact."""
        torch.manual_seed(seed)
        try:
            with torch.device(ak.DEVICE):
                values = list(self.get_inputs())
        except Exception as e:
            raise ProblemError(f"problem {self.name}: get_inputs() raised {describe(e)}") \
                from None
        values = [cast(v, dtype) for v in values]
        if transform is not None:
            values = [transform(v.float()).to(dtype) if is_float(v) else v for v in values]
        names = self.arg_names if len(self.arg_names) == len(values) else \
            [f"input{i}" for i in range(len(values))]
        return dict(zip(names, values))

    def shape_str(self):
        """The inputs' shapes, e.g. 4096x393216 or 4096x4096,4096x4096 (on the meta device when
        get_inputs allows it: no memory, no time)."""
        try:
            with torch.device("meta"):
                values = list(self.get_inputs())
        except Exception:
            values = list(self.inputs(0, torch.float32).values())
        return ",".join("x".join(map(str, v.shape)) or "scalar" if torch.is_tensor(v) else str(v)
                        for v in values)


def forward_names(model_class):
    try:
        params = list(inspect.signature(model_class.forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return []
    plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params] if all(p.kind in plain for p in params) else []


def is_float(value):
    return torch.is_tensor(value) and value.is_floating_point()


def cast(value, dtype):
    """A tensor on the device, in dtype when it is floating (indices and labels keep theirs)."""
    if not torch.is_tensor(value):
        return value
    return value.to(device=ak.DEVICE, dtype=dtype if value.is_floating_point() else value.dtype)


def run(model, inputs):
    """Model's output as the judge's reference: fp32 computed in fp32. torch's defaults let
    cuDNN convolutions use TF32 (10-bit mantissas), which would make fp32 Model miss its own
    float64 result and turn an exact solution into a mismatch."""
    with torch.no_grad(), full_fp32():
        return model(*inputs.values())


@functools.lru_cache(maxsize=4)
def load(path, sha256):
    """The problem at path whose bytes hash to sha256 (imported once per process)."""
    problem = Problem(path)
    if problem.sha256 != sha256:
        raise ProblemError(f"{path} changed while it was being judged; judge it again")
    return problem


def problem_of(plan):
    return load(plan["problem"], plan["sha256"])


# ---- the plan: what bench.py and the scorer judge -------------------------------------------

def plan(attrs, dtypes=None):
    """The plan of a kernel file with KERNEL_TYPE "kernelbench": the problem (its hash checked),
    the judged dtype, and how every dtype is judged (the oracle probe). dtypes: the candidates
    (default: all this device judges; the scorer passes its one). Raises KernelFileError."""
    path, sha = attrs.get("KERNELBENCH_PROBLEM"), attrs.get("KERNELBENCH_SHA256")
    if not path or not sha:
        raise KernelFileError("a kernelbench kernel file needs KERNELBENCH_PROBLEM (the problem "
                              "file) and KERNELBENCH_SHA256 (its hash); `uv run kernelbench.py "
                              "setup PROBLEM.py` writes both")
    resolved = Path(path) if Path(path).is_absolute() else ak.ROOT / path
    if not resolved.is_file():
        raise ProblemError(f"KERNELBENCH_PROBLEM {path} not found; point it at the problem file "
                           f"(or run `uv run kernelbench.py setup PROBLEM.py` again)")
    if state.digest(resolved.read_bytes()) != sha:
        raise ProblemError(f"{path} changed since this kernel file was set up for it (sha256 "
                           f"differs): restore the problem, or set it up again with `uv run "
                           f"kernelbench.py setup {path}`")
    problem = load(str(resolved.resolve()), sha)
    candidates = list(dtypes or judged_dtypes())
    try:
        primary = ak.DTYPE_NAMES[ak.parse_dtype(str(attrs.get("BENCH_DTYPE") or DEFAULT_DTYPE))]
    except ValueError as e:
        raise KernelFileError(f"BENCH_DTYPE: {e}") from None
    if primary not in candidates:  # e.g. bf16 asked on a CPU
        primary = candidates[0]
    oracles = probe(str(problem.path), sha, primary,
                    tuple([primary] + [d for d in candidates if d != primary]))
    return {"kernel_type": "kernelbench", "tag": tag_of(attrs), "shape": [],
            "shape_str": problem.shape_str(), "bench_shapes": [], "dtype": primary,
            "variant": {}, "backend": attrs.get("BACKEND", "triton"),
            "problem": str(problem.path), "sha256": problem.sha256, "oracles": oracles}


@functools.lru_cache(maxsize=4)
def probe(path, sha256, primary, names):
    """{dtype name: {"oracle": "float64" | "model" | None, "note", "out_dtype"}}: how each dtype
    is judged (module docstring). Model is run once per dtype on the problem's inputs."""
    problem, out = load(path, sha256), {}
    reproducible(problem, ak.DTYPES[primary])
    for name in names:
        dtype, is_primary = ak.DTYPES[name], name == primary
        try:
            model, _ = problem.build(fresh_seed(), dtype)
            inputs = problem.inputs(fresh_seed(), dtype)
            eager = run(model, inputs)
        except ProblemError as e:
            if is_primary:
                raise ProblemError(f"{e} (in {name})") from None
            out[name] = {"oracle": None, "note": f"not judged: {e}", "out_dtype": None}
            continue
        except Exception as e:
            if is_primary:
                raise ProblemError(f"problem {problem.name}: Model raised {describe(e)} in "
                                   f"{name}") from None
            out[name] = {"oracle": None, "note": f"not judged: Model raised {describe(e)}",
                         "out_dtype": None}
            continue
        if not torch.is_tensor(eager):
            raise ProblemError(f"problem {problem.name}: Model returns "
                               f"{type(eager).__name__}; the gate judges one output tensor")
        entry = {"out_dtype": str(eager.dtype).replace("torch.", "")}
        try:
            ref = run(copy.deepcopy(model).double(), as_float64(inputs))
        except Exception as e:
            entry.update(oracle="model", note=f"Model in {name} (Model does not run in "
                                              f"float64: {describe(e)})")
            out[name] = entry
            continue
        miss = summary(eager, ref, dtype)["bad"]
        if not miss:
            entry.update(oracle="float64", note=f"float64 (Model in {name} is within {name}'s "
                                                f"tolerance of it)")
        elif is_primary:
            entry.update(oracle="model", note=f"Model in {name}, as KernelBench compares (Model "
                                              f"itself misses {name}'s tolerance of its float64 "
                                              f"result at {miss} of {eager.numel()} elements)")
        else:
            entry.update(oracle=None, note=f"not judged: Model in {name} itself misses {name}'s "
                                           f"tolerance of its float64 result ({miss} of "
                                           f"{eager.numel()} elements)")
        out[name] = entry
        del model, inputs, eager, ref
    if ak.CUDA:
        torch.cuda.empty_cache()
    return out


def reproducible(problem, dtype):
    """get_inputs() must give the same bits under the same seed: the judge checks that inputs
    came back unchanged against them made again."""
    seed = fresh_seed()
    first, again = problem.inputs(seed, dtype), problem.inputs(seed, dtype)
    for name, value in gate.tensors(first).items():
        if not torch.equal(gate.bits(value), gate.bits(again[name])):
            raise ProblemError(f"problem {problem.name}: get_inputs() gives other values under "
                               f"the same torch.manual_seed (it draws from another random "
                               f"source?); the judge needs them reproducible")


def as_float64(inputs):
    return {k: v.double() if is_float(v) else v for k, v in inputs.items()}


# ---- comparing outputs of any size ----------------------------------------------------------

def summary(got, want, dtype):
    """autokernel.mismatches over the whole output, a chunk at a time: {"bad", "atol", "worst":
    (flat index, got, want) or None, "nan", "inf"} (NaN/Inf counted where want is finite)."""
    g, w = got.reshape(-1), want.reshape(-1)
    n = w.numel()
    exact = not w.is_floating_point()  # indices, labels: equal or wrong
    square_sum, finite = 0.0, 0
    for i in range(0, 0 if exact else n, CHUNK):
        c = w[i:i + CHUNK].double()
        c = c[torch.isfinite(c)]
        square_sum, finite = square_sum + float(c.square().sum()), finite + c.numel()
    rms = math.sqrt(square_sum / finite) if finite else 0.0
    out = {"bad": 0, "atol": 0.0, "worst": None, "nan": 0, "inf": 0}
    worst_err = -1.0
    for i in range(0, n, CHUNK):
        gc, wc = g[i:i + CHUNK].double(), w[i:i + CHUNK].double()
        if exact:
            bad = gc != wc
        else:
            bad, out["atol"] = ak.mismatches(gc, wc, dtype, rms=rms)
            ok = torch.isfinite(wc)
            out["nan"] += int((torch.isnan(gc) & ok).sum())
            out["inf"] += int((torch.isinf(gc) & ok).sum())
        count = int(bad.sum())
        if count:
            out["bad"] += count
            err = (gc - wc).abs().nan_to_num(nan=math.inf).masked_fill(~bad, -1.0)
            j = int(err.argmax())
            if float(err[j]) > worst_err:
                worst_err = float(err[j])
                out["worst"] = (i + j, float(gc[j]), float(wc[j]))
    return out


# ---- the stages -----------------------------------------------------------------------------

JUDGE_FAILED = "the problem's Model failed in the judge"


@contextlib.contextmanager
def judge_side(where):
    """The judge's own work on the problem (inputs, Model, the oracle): a failure there is the
    problem's or the judge's, named as such, never a crash of bench.py."""
    try:
        yield
    except Exception as e:
        raise gate.CheckFailure(f"{JUDGE_FAILED} ({describe(e)}) at {where}") from None


class ProblemJudge(gate.Judge):
    """The stages (module docstring) for a ModelNew in the runner, against the problem's Model
    in this process. The gate's call, reply and poison checks are reused as they are."""
    callee = "ModelNew.forward"
    not_applicable = {"edge": "a KernelBench problem fixes its shapes (get_inputs)"}
    library = ()  # aten ops ModelNew may call (a region's: autokernel/region_kind.py)

    def __init__(self, runner, plan, on_stage, log=None):
        self.runner, self.on_stage = runner, on_stage
        self.log = log or (lambda line: None)
        self.problem = problem_of(plan)
        self.primary = ak.DTYPES[plan["dtype"]]
        self.oracles = plan["oracles"]
        self.judged = [ak.DTYPES[n] for n, entry in self.oracles.items() if entry["oracle"]]
        self.checks = 0
        self.models = None     # after build(): {"dtype", "model" (Model in it), "oracle", "kind"}
        self.last = None       # a sample of the last output, to recognise a cached result
        self.sample_at = None  # which elements the samples take

    def smoke(self):
        for name, entry in self.oracles.items():
            self.log(f"oracle_{name}: {entry['note']}")
        self.build(self.primary)
        for _ in range(2):
            self.case("smoke", self.primary)

    def sweep(self):
        for dtype in self.judged:
            for _ in range(SWEEP_MODELS):
                self.build(dtype)
                for _ in range(2):
                    self.case("sweep", dtype)

    def stability(self):
        for dtype in self.judged:
            self.build(dtype)
            for label, transform in stability_cases(dtype):
                self.case("stability", dtype, transform, label)

    def determinism(self):
        self.build(self.primary)
        inputs, make, ref, where = self.prepare("determinism", self.primary)
        first = None
        for _ in range(3):
            out = self.call(inputs, make, ref, float("nan"), where)[0]
            if first is None:
                first = out
                continue
            differ = gate.changed_elements(out, first)
            if differ:
                raise gate.CheckFailure(f"non-deterministic: 3 runs on the same inputs differ in "
                                        f"{differ} of {out.numel()} elements at {where}")
        self.checks += 1
        self.compare(first, ref, make, where)

    # ---- helpers ----
    def build(self, dtype):
        """A fresh Model here and ModelNew in the runner, under one new seed."""
        seed, name = fresh_seed(), ak.DTYPE_NAMES[dtype]
        kind = self.oracles[name]["oracle"]
        self.models = None
        with judge_side(f"{name}, model seed {seed}"):
            model, init_args = self.problem.build(seed, dtype)
            oracle = copy.deepcopy(model).double() if kind == "float64" else model
        reply = self.runner.build(init_args, seed, str(dtype).replace("torch.", ""),
                                  self.library)
        if reply.get("status") != "built":
            error = reply.get("error", reply.get("status"))
            if reply.get("kind") == "device":
                raise gate.CheckCrash(f"device fault building ModelNew in {name}: {error}")
            raise gate.CheckFailure(f"{BUILD_FAILED} {error} ({name}, model seed {seed})")
        self.models = {"dtype": dtype, "model": model, "oracle": oracle, "kind": kind}
        self.last = None

    def prepare(self, stage, dtype, transform=None, label=""):
        """(inputs, a maker of the same inputs again, the oracle's output, where) for one input
        set from a fresh seed."""
        seed = fresh_seed()
        make = lambda: self.problem.inputs(seed, dtype, transform)  # noqa: E731
        where = f"{ak.DTYPE_NAMES[dtype]}, inputs seed {seed}" + (f", {label}" if label else "")
        self.on_stage(stage, where)
        with judge_side(where):
            oracle, kind = self.models["oracle"], self.models["kind"]
            if kind == "float64":
                # The inputs are made again after the float64 run rather than held through it:
                # at KernelBench's sizes (GBs) they crowd it out of memory.
                ref = run(oracle, as_float64(make()))
                inputs = make()
            else:
                inputs = make()
                ref = run(oracle, inputs)
        return inputs, make, ref, where

    def case(self, stage, dtype, transform=None, label=""):
        """One input set: the oracle, the call, the values. A stability case counts only where
        Model itself in dtype passes it (else it tests the problem, not the solution)."""
        inputs, make, ref, where = self.prepare(stage, dtype, transform, label)
        if transform is not None and self.models["kind"] == "float64":
            with judge_side(where):
                missed = summary(run(self.models["model"], inputs), ref, dtype)["bad"]
            if missed:
                self.log(f"{stage}: {where}: skipped (Model itself misses the tolerance there)")
                return
        out, reply = self.call(inputs, make, ref, float("nan"), where)
        self.checks += 1
        if reply.get("reused") and self.last is not None:
            raise gate.CheckFailure(f"returned the same output buffer for two different inputs "
                                    f"(a result cached from an earlier call) at {where}")
        self.compare(out, ref, make, where)
        self.last = self.sample(out)

    def output_buffer(self, ref, inputs):
        name = ak.DTYPE_NAMES[self.models["dtype"]]
        dtype = getattr(torch, self.oracles[name]["out_dtype"])  # Model's own output dtype
        return torch.full(ref.shape, float("nan") if dtype.is_floating_point else 0,
                          dtype=dtype, device=ak.DEVICE)

    def check_inputs(self, inputs, make, where):
        """Against the same seed's inputs made again (no copy of GB-sized inputs is held)."""
        with judge_side(where):
            again = make()
        for name, tensor in gate.tensors(inputs).items():
            changed = gate.changed_elements(tensor, again[name])
            if changed:
                raise gate.CheckFailure(f"{self.callee} modified its input {name} ({changed} "
                                        f"of {tensor.numel()} elements changed) at {where}")

    def sample(self, out):
        flat = gate.bits(out)
        if self.sample_at is None:
            self.sample_at = torch.randint(0, max(flat.numel(), 1),
                                           (min(SAMPLE, flat.numel()),), device=flat.device)
        return flat[self.sample_at].clone()

    def compare(self, out, ref, make, where):
        """Values against the oracle, a chunk at a time; a wrong output is named: never written
        (the poison shows through), NaN or Inf, the last call's result again, or wrong values."""
        dtype = self.models["dtype"]
        found = summary(out, ref, dtype)
        if not found["bad"]:
            return
        total = out.numel()
        if out.is_floating_point():  # again with a finite poison: unwritten elements follow it
            try:
                again = self.call(make(), make, ref, gate.SENTINEL, where)[0]
            except gate.CheckFailure:
                again = None
            if again is not None:
                differ = gate.bits(again) != gate.bits(out)
                unwritten = differ & torch.isnan(out.reshape(-1)) \
                    & (again.reshape(-1) == gate.SENTINEL)
                n = int(torch.count_nonzero(differ))
                if n and int(torch.count_nonzero(unwritten)) == n:
                    raise gate.CheckFailure(f"elements left unwritten ({n} of {total}) at "
                                            f"{where}")
        for key, label in (("nan", "NaN"), ("inf", "Inf")):
            if found[key]:
                raise gate.CheckFailure(f"output has {label} ({found[key]} of {total} "
                                        f"elements) at {where}")
        if self.last is not None and torch.equal(self.sample(out), self.last):
            raise gate.CheckFailure(f"returned a result cached from an earlier call (the last "
                                    f"call's output, for other inputs) at {where}")
        index, got, want = found["worst"]
        raise gate.CheckFailure(
            f"wrong values at {where}: {found['bad']} of {total} elements outside "
            f"rtol={ak.tolerance(dtype):g}, atol={found['atol']:.3g} (worst at "
            f"{gate.unravel(index, out.shape)}: got {got:.6g}, expected {want:.6g})")


# ---- timing (autokernel/judge.py's measure) -------------------------------------------------

def timing_case(plan, runners):
    """What the judge times a ModelNew on (a timing.Case): every runner's ModelNew built under
    one seed, fresh inputs in the judged dtype from any seed, the problem's Model as the
    oracle."""
    problem, dtype, name = problem_of(plan), ak.DTYPES[plan["dtype"]], plan["dtype"]
    entry, seed = plan["oracles"][name], fresh_seed()
    try:
        model, init_args = problem.build(seed, dtype)
        for runner in runners:
            reply = runner.build(init_args, seed, str(dtype).replace("torch.", ""))
            if reply.get("status") != "built":
                raise TimingError(f"timing: {BUILD_FAILED} {reply.get('error')}")
        float64 = entry["oracle"] == "float64"
        oracle = copy.deepcopy(model).double() if float64 else model
        del model
        out_shape = tuple(run(oracle, as_float64(problem.inputs(0, dtype)) if float64 else
                              problem.inputs(0, dtype)).shape)
    except ProblemError as e:
        raise TimingError(f"timing: {e}") from None
    return Case(make=lambda s: problem.inputs(s % 2 ** 32, dtype),
                reference=lambda inputs: run(oracle, as_float64(inputs) if float64 else inputs),
                wrong=lambda out, want, inputs: bool(summary(out, want, dtype)["bad"]),
                out_shape=out_shape, out_dtype=getattr(torch, entry["out_dtype"]))


# ---- baselines: the problem's Model, eager and compiled -------------------------------------

COMPILE_MODE = "default"  # KernelBench's torch.compile baseline is inductor's default mode


def baselines(plan, compile_mode=COMPILE_MODE):
    """{"eager_us", "compile_us", ...}: Model in the judged dtype, timed like every baseline here
    (on a GPU the judge's windows, as bench.py times a ModelNew: autokernel/timing.py), measured
    once per device and cached in prepare.json. No torch.compile on a CPU (compile_us None);
    compile_mode "none" skips it anywhere."""
    from autokernel import baselines as base
    problem = problem_of(plan)
    key = (f"kernelbench|{problem.name}|{problem.sha256[:12]}|{plan['shape_str']}|"
           f"{plan['dtype']}|{compile_mode}")
    entry = base.read_cache()["baselines"].get(key)
    if not isinstance(entry, dict) or "eager_us" not in entry:
        entry = measure_baselines(problem, ak.DTYPES[plan["dtype"]], compile_mode)
        base.update_cache(lambda cache: cache["baselines"].__setitem__(key, entry))
    return entry


def measure_baselines(problem, dtype, compile_mode):
    from autokernel import baselines as base
    entry = {"kernel_type": "kernelbench", "problem": problem.name,
             "dtype": ak.DTYPE_NAMES[dtype], "measured_at": base.now()}
    try:
        model, _ = problem.build(fresh_seed(), dtype)
        inputs = problem.inputs(fresh_seed(), dtype)
    except ProblemError as e:
        return dict(entry, eager_us=None, compile_us=None, eager_error=str(e))

    def forward(**values):
        with torch.no_grad():
            return model(*values.values())
    case = None
    try:
        out = forward(**inputs)
        if ak.CUDA and isinstance(out, torch.Tensor):  # the windows' fresh sets, as for ModelNew
            case = Case(make=lambda s: problem.inputs(s % 2 ** 32, dtype), reference=None,
                        wrong=None, out_shape=tuple(out.shape), out_dtype=out.dtype)
        del out
        entry["eager_us"] = base.clock_us(forward, inputs, case)
    except Exception as e:  # out of memory at the problem's size, say
        entry.update(eager_us=None, eager_error=describe(e))
    if not ak.CUDA or compile_mode == "none":
        entry.update(compile_us=None, compile_note="not measured on a CPU" if not ak.CUDA
                     else "not asked (--compile-mode none)")
    else:
        us, seconds, error = base.compile_and_time(forward, inputs, compile_mode, case)
        entry.update(compile_us=us, compile_mode=compile_mode, compile_s=seconds)
        if error:
            entry["compile_error"] = error
        torch._dynamo.reset()  # the compiled graph holds the inputs (GBs at KernelBench sizes)
    del model, inputs, case
    if ak.CUDA:
        torch.cuda.empty_cache()
    return entry


def speedups(plan, latency_us, compile_mode=COMPILE_MODE):
    """What bench.py's row and the scorer report for a correct ModelNew timed at latency_us."""
    entry = baselines(plan, compile_mode)
    eager, compiled = entry.get("eager_us"), entry.get("compile_us")
    return {"eager_us": eager, "compile_us": compiled,
            "speedup_vs_pytorch": eager / latency_us if eager and latency_us else None,
            "speedup_vs_compile": compiled / latency_us if compiled and latency_us else None,
            "pct_peak": None}


# ---- the kind of problem the judge asks about (autokernel/kinds.py) -------------------------

class KernelBenchKind:
    """KERNEL_TYPE "kernelbench": a ModelNew judged against its problem's Model."""
    judge = ProblemJudge
    plan = staticmethod(plan)
    timing_case = staticmethod(timing_case)

    def missing_entry(self, hello):
        if not hello.get("has_model_new"):
            return ("kernel file defines no ModelNew class; it must take Model's init arguments "
                    "and compute Model's forward")
        return None

    def baselines(self, plan, latency_us):
        """The problem's Model, eager and compiled."""
        return speedups(plan, latency_us)


KIND = KernelBenchKind()
