"""
The five correctness stages, judged where the kernel cannot reach.

The judge (bench.py's process) makes fresh random inputs, computes the float64 oracle itself,
and asks a runner to call kernel_fn: in a real run the runner is the untrusted child process
(autokernel/child.py) that imported the kernel file; the tests may use one in-process. The runner
only ever copies the kernel's output into a buffer the judge allocated, so every check below looks
at the judge's own memory:

    1 smoke        primary shape and dtype (BENCH_SHAPES[0] / BENCH_DTYPE, else the type's)
    2 sweep        the type's sweep shapes + BENCH_SHAPES, in every dtype
    3 stability    adversarial inputs (the type's makers) in every dtype
    4 determinism  three runs on the same inputs, bitwise equal
    5 edge         non-power-of-two and vocabulary-sized shapes, in every dtype

Honesty: fresh inputs every run (never a fixed seed); two input sets per check (an output reused
for new inputs, or identical wrong outputs, is a cached result); outputs allocated inside kernel_fn
are poisoned by the runner (NaN, then a finite sentinel, to name "elements left unwritten"); the
inputs must come back bit for bit as they went in; torch compute ops and outputs that alias an
input are reported by the runner and fail. The first failing stage stops the run and names why.
"""
import os
import time

import torch

import autokernel as ak

STAGES = ("smoke", "sweep", "stability", "determinism", "edge")
SENTINEL = 7777.0  # second poison: finite and far from any softmax/norm/sum output here


class CheckFailure(Exception):
    """A stage failed (FAIL)."""


class CheckCrash(Exception):
    """The device is gone (illegal memory access, device-side assert): CRASH, stop at once."""


def fresh_generator():
    """Fresh inputs every run: nothing to memorise. Never a fixed seed."""
    gen = torch.Generator(device=ak.DEVICE)
    gen.manual_seed(fresh_seed())
    return gen


def fresh_seed():
    return int.from_bytes(os.urandom(8), "little") >> 1


def check(runner, plan, quick=False, on_stage=None, log=None, judge_class=None):
    """Run the stages through `runner` (see autokernel/child.Runner). Returns {"correctness":
    "PASS" | "FAIL" | "CRASH", "reason", "stages": {name: "PASS" | "FAIL" | "skipped"},
    "failed_stage", "checks"}. quick: the smoke stage only. judge_class: the plan's kind's Judge
    (autokernel/kinds.py; default: a kernel type's, Judge below)."""
    log = log or (lambda line: None)
    result = {"correctness": "FAIL", "reason": "", "stages": {s: "skipped" for s in STAGES},
              "failed_stage": None, "checks": 0}
    judge = (judge_class or Judge)(runner, plan, on_stage or (lambda name, where="": None), log)
    for number, stage in enumerate(STAGES, start=1):
        if result["failed_stage"] or (quick and number > 1):
            why = f"{result['failed_stage']} failed" if result["failed_stage"] else "--quick"
            log(f"stage_{number}_{stage}: skipped ({why})")
            continue
        if stage in judge.not_applicable:
            log(f"stage_{number}_{stage}: skipped ({judge.not_applicable[stage]})")
            continue
        started, before = time.perf_counter(), judge.checks
        try:
            getattr(judge, stage)()
        except (CheckFailure, CheckCrash) as e:
            crash = isinstance(e, CheckCrash)
            result.update(correctness="CRASH" if crash else "FAIL", failed_stage=stage,
                          reason=f"{stage}: {e}")
            result["stages"][stage] = "FAIL"
            log(f"stage_{number}_{stage}: FAIL {e}")
            if crash:  # the device is unusable: nothing more can run in that process
                break
            continue
        result["stages"][stage] = "PASS"
        checks = judge.checks - before
        log(f"stage_{number}_{stage}: PASS ({checks} check{'s' * (checks != 1)}, "
            f"{time.perf_counter() - started:.2f} s)")
    result["checks"] = judge.checks
    if getattr(judge, "library_calls", None):  # a region kernel's GEMMs and convolutions
        result["library_calls"] = judge.library_calls
    if not result["failed_stage"]:
        result["correctness"] = "PASS"
    return result


class Judge:
    """Makes inputs, has the runner call kernel_fn on them, judges what comes back."""
    callee = "kernel_fn"   # what the messages call the code under judgement
    not_applicable = {}    # stage -> why it does not apply (skipped, not failed)

    def __init__(self, runner, plan, on_stage, log=None):
        self.runner, self.on_stage = runner, on_stage
        self.ktype = ak.KERNEL_TYPES[plan["kernel_type"]]
        self.primary = tuple(plan["shape"])
        self.bench_shapes = [tuple(s) for s in plan["bench_shapes"]]
        self.dtype = ak.DTYPES[plan["dtype"]]
        self.variant = plan.get("variant") or {}  # the timed one, for smoke and determinism
        self.gen = fresh_generator()
        self.checks = 0

    # The five stages, in order. Each raises CheckFailure naming what is wrong.
    def smoke(self):
        self.random_case("smoke", self.primary, self.dtype, self.variant)

    def sweep(self):
        self.cycle("sweep", unique(list(self.ktype.shapes("sweep")) + self.bench_shapes))

    def stability(self):
        for shape in self.ktype.shapes("stability"):
            for variant in self.ktype.variants:
                for dtype in self.ktype.dtypes():
                    cases = self.ktype.adversarial(tuple(shape), dtype, ak.DEVICE, self.gen,
                                                   **variant)
                    for label, inputs in cases:
                        self.judge("stability", [inputs],
                                   f"{self.where(shape, dtype, variant)}, {label}")

    def determinism(self):
        shape, dtype = self.primary, self.dtype
        where = self.where(shape, dtype, self.variant)
        self.on_stage("determinism", where)
        inputs = self.ktype.inputs(shape, dtype, ak.DEVICE, self.gen, self.variant)
        pristine = clone(inputs)
        ref = self.ktype.reference(**pristine)
        outs = [self.call(inputs, pristine, ref, float("nan"), where)[0] for _ in range(3)]
        self.checks += 1
        for out in outs[1:]:
            differ = changed_elements(out, outs[0])
            if differ:
                raise CheckFailure(f"non-deterministic: 3 runs on the same inputs differ in "
                                   f"{differ} of {out.numel()} elements at {where}")
        self.compare(outs[0], ref, pristine, where)

    def edge(self):
        self.cycle("edge", self.ktype.shapes("edge"))

    # ---- helpers ----
    def cycle(self, stage, shapes):
        """Each shape in every dtype, the type's variants taken in turn over the shapes (so each
        variant meets several shapes and every dtype)."""
        variants = self.ktype.variants
        for i, shape in enumerate(shapes):
            for dtype in self.ktype.dtypes():
                self.random_case(stage, shape, dtype, variants[i % len(variants)])

    def where(self, shape, dtype, variant):
        options = "".join(f" {k}={v}" for k, v in variant.items())
        return f"{self.ktype.shape_str(shape)} {ak.DTYPE_NAMES[dtype]}{options}"

    def random_case(self, stage, shape, dtype, variant):
        # Two different input sets at the same shape: a result cached from the first call, or
        # an output buffer reused across calls, fails on the second.
        sets = [self.ktype.inputs(tuple(shape), dtype, ak.DEVICE, self.gen, variant)
                for _ in range(2)]
        self.judge(stage, sets, self.where(shape, dtype, variant))

    def judge(self, stage, sets, where):
        self.on_stage(stage, where)
        pristine = [clone(inputs) for inputs in sets]
        refs = [self.ktype.reference(**inputs) for inputs in pristine]
        outs = []
        for i, (inputs, clean, ref) in enumerate(zip(sets, pristine, refs)):
            out, reply = self.call(inputs, clean, ref, float("nan"), where)
            self.checks += 1
            if i and reply.get("reused"):
                raise CheckFailure(f"returned the same output buffer for two different inputs "
                                   f"(a result cached from an earlier call) at {where}")
            for earlier, earlier_ref in zip(outs, refs):
                # Identical outputs for different inputs are a cache only if they are wrong
                # for these inputs: a correct single bf16 sum can equal another draw's.
                if torch.equal(bits(out), bits(earlier)) and not torch.equal(ref, earlier_ref) \
                        and bool(self.ktype.mismatches(out, ref, clean)[0].any()):
                    raise CheckFailure(f"returned a result cached from an earlier call "
                                       f"(identical output for different inputs) at {where}")
            self.compare(out, ref, clean, where)
            outs.append(out)

    def call(self, inputs, pristine, ref, poison, where):
        """kernel_fn on inputs, through the runner: the judge's copy of the output and the
        runner's reply. Checks everything but the values."""
        buffer = self.output_buffer(ref, inputs)
        reply = self.runner.call(inputs, poison, buffer)
        status = reply.get("status")
        if status == "forbidden":
            raise CheckFailure(f"{self.callee} called torch compute op {reply['op']}; do the math "
                               f"in the kernel's own Triton or CUDA code")
        if status == "raised":
            kind, error = reply.get("kind"), reply.get("error", "")
            if kind == "oom":
                raise CheckFailure(f"out of memory at {where}: {error}")
            if kind == "device":
                raise CheckCrash(f"device fault at {where}: {error}")
            raise CheckFailure(f"{self.callee} raised {error} at {where}")
        self.check_reply(reply, buffer, where)
        self.check_inputs(inputs, pristine, where)
        return buffer, reply

    def output_buffer(self, ref, inputs):
        """Where the runner copies the output: NaN, so an element it never wrote shows."""
        return torch.full(ref.shape, float("nan"), dtype=ak.out_dtype(self.ktype, inputs),
                          device=ak.DEVICE)

    def check_inputs(self, inputs, pristine, where):
        """The inputs must come back bit for bit as they went in."""
        for name, tensor in tensors(inputs).items():
            changed = changed_elements(tensor, pristine[name])
            if changed:
                raise CheckFailure(f"{self.callee} modified its input {name} ({changed} of "
                                   f"{tensor.numel()} elements changed) at {where}")

    def check_reply(self, reply, buffer, where):
        """The output's type, shape, dtype and device as the runner saw them; aliasing."""
        if reply.get("type") != "Tensor":
            raise CheckFailure(f"{self.callee} returned {reply.get('type')}, expected a new "
                               f"torch.Tensor at {where}")
        if reply.get("aliases"):
            raise CheckFailure(f"the output shares memory with input {reply['aliases'][0]}; "
                               f"return a new tensor")
        if tuple(reply.get("shape", ())) != tuple(buffer.shape):
            raise CheckFailure(f"wrong output shape {tuple(reply.get('shape', ()))}, expected "
                               f"{tuple(buffer.shape)} at {where}")
        expected = str(buffer.dtype).replace("torch.", "")
        if reply.get("dtype") != expected:
            raise CheckFailure(f"wrong output dtype {reply.get('dtype')}, expected {expected} "
                               f"at {where}")
        if not reply.get("copied"):
            raise CheckFailure(f"output on {reply.get('device')}, expected {buffer.device}")

    def compare(self, out, ref, pristine, where):
        """Values against the fp64 oracle (KernelType.mismatches: the input dtype's tolerance,
        atol in units of the output's RMS or the type's error_scale). A mismatch is re-run with a
        finite poison: outputs that differ exactly where the poison differs were never written."""
        dtype = pristine[self.ktype.args[0]].dtype
        tol = ak.tolerance(dtype)
        got, want = out.double(), ref.double()
        bad, atol = self.ktype.mismatches(got, want, pristine)
        if not bool(bad.any()):
            return
        total = out.numel()
        inputs = clone(pristine)
        try:
            again = self.call(inputs, pristine, ref, SENTINEL, where)[0]
        except CheckFailure:
            again = None
        if again is not None:
            differ = bits(again) != bits(out)
            unwritten = differ & torch.isnan(out.reshape(-1)) & (again.reshape(-1) == SENTINEL)
            n = int(differ.sum())
            if n and int(unwritten.sum()) == n:
                raise CheckFailure(f"elements left unwritten ({n} of {total}) at {where}")
        finite_ref = torch.isfinite(want)
        for label, mask in (("NaN", torch.isnan(got)), ("Inf", torch.isinf(got))):
            count = int((mask & finite_ref).sum())
            if count:
                raise CheckFailure(f"output has {label} ({count} of {total} elements) at {where}")
        n = int(bad.sum())
        err = (got - want).abs().masked_fill(~bad, 0)
        worst = int(err.reshape(-1).argmax())
        index = [int(i) for i in unravel(worst, out.shape)]
        raise CheckFailure(
            f"wrong values at {where}: {n} of {total} elements outside rtol={tol:g}, "
            f"atol={atol:.3g} (worst at {index}: got {got.reshape(-1)[worst].item():.6g}, "
            f"expected {want.reshape(-1)[worst].item():.6g})")


def tensors(inputs):
    """The tensor arguments of an input set (the others are scalars and None)."""
    return {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}


def clone(inputs):
    """An input set's copy: tensors cloned, scalars as they are."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def unique(shapes):
    seen, out = set(), []
    for s in shapes:
        if tuple(s) not in seen:
            seen.add(tuple(s))
            out.append(tuple(s))
    return out


def unravel(flat, shape):
    index = []
    for size in reversed(tuple(shape)):
        index.append(flat % size)
        flat //= size
    return list(reversed(index))


def bits(t):
    """The raw bits of a tensor, flat (bitwise equality, NaN included)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    flat = t.detach().reshape(-1)
    return flat.view(ints[flat.element_size()]) if flat.is_floating_point() else flat


def changed_elements(tensor, original):
    """How many elements differ bit for bit: torch.equal first (no allocation), then a count
    (a bool tensor's .sum() would go through an int64 copy: 14 GiB at a 1.9G-element input)."""
    a, b = bits(tensor), bits(original)
    return 0 if torch.equal(a, b) else int(torch.count_nonzero(a != b))
