"""
Running a whole model and judging it end to end: the output to compare (logits, or for a model
that returns only its loss, the logits the loss was computed from and the loss), the comparison
against the original model's output, and the timing of a forward (CUDA events, or replays of a
CUDA graph of it). verify.py's report is built from these.

Correctness, in the output's dtype:
  rel_err    = max|y - y_ref| / max|y_ref|, must be <= E2E_TOLERANCE[dtype]
  top1       = strict argmax agreement over positions: reported only (randomly initialised
               models have near-tied logits whose argmax flips under rounding noise)
  top1_tie_aware = a position agrees when the kernel model's top token is within the tolerance
               band (E2E_TOLERANCE * max|y_ref|) of the reference's best: must be >= TOP1_MIN
"""
import statistics
import time

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import autokernel
from autokernel import ops
from autokernel.cli import describe

# Measured noise between two correct implementations of a 6-layer random-init LLaMA: bf16 ~1e-2,
# fp16 ~1.3e-3.
E2E_TOLERANCE = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 5e-2}
TOP1_MIN = {torch.float32: 0.99, torch.float16: 0.97, torch.bfloat16: 0.97}


def forward(model, inputs):
    with torch.no_grad():
        if isinstance(inputs, dict):
            out = model(**inputs)
        elif isinstance(inputs, (tuple, list)):
            out = model(*inputs)
        else:
            out = model(inputs)
    return output_tensor(out)


def output_tensor(out):
    """The tensor to compare: a tensor itself, .logits (then .loss) of a transformers output,
    the first tensor of a tuple or dict."""
    if isinstance(out, torch.Tensor):
        return out
    for attr in ("logits", "loss"):
        if isinstance(getattr(out, attr, None), torch.Tensor):
            return getattr(out, attr)
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) \
        else []
    for v in values:
        if isinstance(v, torch.Tensor):
            return v
    raise TypeError(f"the model returned {type(out).__name__}, which holds no tensor to compare")


class _LossInput(TorchFunctionMode):
    """Records the logits F.cross_entropy is given, so a model whose forward returns only its
    loss still has its logits compared (a scalar loss hides most errors)."""

    def __init__(self):
        super().__init__()
        self.logits = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.cross_entropy and args and isinstance(args[0], torch.Tensor) \
                and not args[0].is_meta:
            self.logits = args[0].detach()
        elif ops.kernel_type_of(func) == "cross_entropy":
            # A compiled swap's cross_entropy op: dynamo traces it, not the F.cross_entropy call
            # the swap intercepted (which the mode sees in eager runs).
            logits = args[0] if args else kwargs["logits"]
            if not logits.is_meta:
                self.logits = logits.detach()
        return func(*args, **(kwargs or {}))


def checked_forward(model, inputs):
    """(output tensor, the loss's input logits when the output is a scalar loss, else None)."""
    capture = _LossInput()
    with capture:
        y = forward(model, inputs)
    return y, (capture.logits if y.dim() == 0 else None)


def compare_runs(run, run_ref):
    """compare() on the logits; for a model that returns a loss, on the logits the loss was
    computed from AND on the loss."""
    (y, logits), (y_ref, logits_ref) = run, run_ref
    if logits_ref is None:
        return compare(y, y_ref)
    if logits is None:
        result = compare(y, y_ref)
        result.update(passed=False, error="the kernels' run computed no F.cross_entropy")
        return result
    result = compare(logits, logits_ref)
    loss = compare(y, y_ref)
    result.update(output="logits (the loss's input)", loss_rel_err=loss["rel_err"],
                  passed=result["passed"] and loss["passed"])
    if loss["error"] and not result["error"]:
        result["error"] = f"loss: {loss['error']}"
    return result


def compare(y, y_ref):
    """rel_err against the tolerance and (for logits) tie-aware top-1 agreement (see the module
    docstring)."""
    dtype = y_ref.dtype if y_ref.dtype in E2E_TOLERANCE else torch.float32
    tol, top1_min = E2E_TOLERANCE[dtype], TOP1_MIN[dtype]
    result = {"output": "logits" if y_ref.dim() >= 2 else "tensor", "shape": list(y_ref.shape),
              "tolerance": tol, "top1_min": top1_min, "max_abs_err": None, "rel_err": None,
              "top1": None, "top1_tie_aware": None, "passed": False, "error": None}
    if y.shape != y_ref.shape or y.dtype != y_ref.dtype:
        result["error"] = f"output {tuple(y.shape)} {y.dtype} != original {tuple(y_ref.shape)} " \
                          f"{y_ref.dtype}"
        return result
    a, b = y.float(), y_ref.float()
    if not torch.isfinite(a).all() and torch.isfinite(b).all():
        result["error"] = "output has inf/nan where the original has none"
        return result
    diff = (a - b).abs().nan_to_num(0.0)
    scale = b.abs().nan_to_num(0.0).max().item()
    max_abs = diff.max().item() if diff.numel() else 0.0
    rel = max_abs / scale if scale > 0 else max_abs
    result.update(max_abs_err=max_abs, rel_err=rel)
    if b.numel() > 1 and torch.isfinite(b).all() and b.max() == b.min():
        # (a randomly initialized model whose norms scale everything to zero, say)
        result["note"] = f"the original's output is constant ({b.flatten()[0].item():g} " \
            "everywhere): a wrong kernel upstream of it would pass unseen; check the model " \
            "gives varied outputs (its init, its inputs)"
    passed = rel <= tol
    if y_ref.dim() >= 2 and y_ref.shape[-1] > 1:
        top_k, top_ref = a.argmax(-1), b.argmax(-1)
        result["top1"] = (top_k == top_ref).float().mean().item()
        band = tol * max(scale, 1e-12)
        ref_at_k = b.gather(-1, top_k.unsqueeze(-1)).squeeze(-1)
        result["top1_tie_aware"] = (ref_at_k >= b.max(-1).values - band).float().mean().item()
        passed = passed and result["top1_tie_aware"] >= top1_min
    result["passed"] = passed
    return result


def sync():
    if autokernel.CUDA:
        torch.cuda.synchronize()


class GraphCaptureError(Exception):
    """The forward could not be captured in a CUDA graph (it syncs, or allocates differently)."""


def capture(model, inputs, warmup):
    """One forward as a CUDA graph: warm-up forwards on a side stream (as torch.cuda.graph
    asks; autotuning happens here), then the capture. Replaying it costs no per-op host work."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(max(warmup, 2)):
            forward(model, inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            forward(model, inputs)
    except Exception as e:
        raise GraphCaptureError(describe(e)) from None
    return graph


def time_forward(model, inputs, warmup, repeat, graphs=False):
    """Median milliseconds of `repeat` forwards after `warmup` untimed ones; with graphs, of
    `repeat` replays of a CUDA graph of the forward."""
    run = capture(model, inputs, warmup).replay if graphs else lambda: forward(model, inputs)
    for _ in range(warmup):
        run()
    sync()
    return median_ms(run, repeat)


def median_ms(run, repeat):
    """Median milliseconds of `repeat` calls of run(), each timed alone (CUDA events on a GPU)."""
    times = []
    for _ in range(repeat):
        if autokernel.CUDA:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def interleaved(runners, rounds, repeat):
    """Per runner, its median_ms in each of `rounds` rounds. Every round times every runner, in
    an order that reverses from one round to the next, so that drift (clocks, heat, other work on
    the machine) falls on all of them alike. runners: [(context, run)], where context() is the
    context manager a run needs around it (a swap's, say) and run() one forward."""
    per_round = [[] for _ in runners]
    for r in range(rounds):
        for i in (range(len(runners)) if r % 2 == 0 else reversed(range(len(runners)))):
            context, run = runners[i]
            with context():
                per_round[i].append(median_ms(run, repeat))
    return per_round


def model_dtype(model):
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
