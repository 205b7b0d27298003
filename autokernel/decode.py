"""
Generation: a decoder's prompt prefilled once, then one new token per sequence per step over a
static KV cache. Most of a served language model's GPU time goes here: a step reads every weight
and the live cache to produce B tokens, so it is memory-bound, and launch-bound without CUDA
graphs.

    decoder = decoder_for(model, batch, prompt_len + new)  # the shipped LLaMA or a transformers LM
    ref = greedy(decoder, prompt, new)          # the original's tokens and every step's logits
    step = Step(decoder, batch)                 # one decode step: eager, compiled, graph-replayed
    check = teacher_forced(step, prompt, ref)   # the same tokens through a variant, step by step

Teacher forcing: every variant is fed the original's greedy tokens, so step i of a variant and
of the original see the same inputs and their logits must agree within the model's tolerance
(autokernel/endtoend.E2E_TOLERANCE). Comparing generated text instead would fail on ties: with
random weights the top two logits are often closer than rounding. The greedy tokens must still
be identical wherever the original's top-1 margin exceeds the tolerance.

The floor of a step is the bytes it must read, every weight once plus the live KV cache, over the
GPU's copy bandwidth (step_bytes, roofline_tokens_per_s).
"""
import time

import torch

import autokernel
from autokernel.cli import UsageError
from autokernel.endtoend import E2E_TOLERANCE, sync


def parse_generate(text):
    """'512x256' -> (512, 256): prompt tokens, new tokens; a one-line error otherwise."""
    try:
        prompt, new = (int(v) for v in str(text).lower().split("x"))
    except ValueError:
        prompt = new = 0
    if prompt < 1 or new < 1:
        raise UsageError(f"--generate {text!r}: use PROMPTxNEW, e.g. 512x256 (a 512-token "
                         "prompt, then 256 decode steps)")
    return prompt, new


class LLaMADecoder:
    """models/llama.py's LLaMA with its KVCache: forward(idx, cache=..., positions=...)."""

    def __init__(self, model, batch, max_len):
        self.model, self.cache = model, model.new_cache(batch, max_len)

    def __call__(self, tokens, positions):
        return self.model(tokens, cache=self.cache, positions=positions)[:, -1]

    def reset(self):
        for c in self.cache:
            c.k.zero_()
            c.v.zero_()

    def cache_tensors(self):
        return [t for c in self.cache for t in (c.k, c.v)]


class HFDecoder:
    """A transformers causal LM with its StaticCache (the cache transformers' own compiled
    generation uses): cache_position carries the step's positions on the device."""

    def __init__(self, lm, batch, max_len):
        import transformers
        self.model, self.batch, self.max_len = lm, batch, max_len
        self.cache = transformers.StaticCache(config=lm.config, max_cache_len=max_len)

    def __call__(self, tokens, positions):
        out = self.model(input_ids=tokens, past_key_values=self.cache, cache_position=positions,
                         use_cache=True, logits_to_keep=1)
        return out.logits[:, -1]

    def reset(self):
        self.cache.reset()

    def cache_tensors(self):
        return [t for layer in self.cache.layers for t in (layer.keys, layer.values)
                if isinstance(t, torch.Tensor)]


def decoder_for(model, batch, max_len):
    """The decoder that runs `model` (as models/load.py built it) with a static KV cache of
    max_len positions, or a one-line UsageError saying which models generate."""
    inner = getattr(model, "model", None)  # models/load.HFLogits wraps a transformers model
    if inner is not None and hasattr(inner, "generation_config"):
        if not getattr(inner.config, "is_decoder", True) or inner.config.model_type in (
                "bert", "roberta", "distilbert"):
            raise UsageError(f"--generate needs a decoder; {inner.config.model_type} is not one")
        limit = getattr(inner.config, "max_position_embeddings", None)
        if limit and max_len > limit:
            raise UsageError(f"--generate needs {max_len} positions; the model has {limit}")
        return HFDecoder(inner, batch, max_len)
    if hasattr(model, "new_cache"):
        try:
            return LLaMADecoder(model, batch, max_len)
        except ValueError as e:
            raise UsageError(f"--generate: {e}") from None
    raise UsageError(f"--generate needs a decoder with a KV cache: {type(model).__name__} has "
                     "none (use models/llama.py or a transformers causal LM, --module "
                     "transformers)")


def positions(start, length, device):
    return torch.arange(start, start + length, device=device)


class Step:
    """One decode step of a decoder, the thing each variant times: fn(tokens [B, 1], positions
    [1]) -> logits [B, V] (the decoder itself, or torch.compile of it), called directly or
    replayed from a CUDA graph of it. Its inputs live in static buffers, so a replay is the whole
    step: no host work but two tiny copies."""

    def __init__(self, decoder, batch, fn=None, device=None):
        self.decoder, self.fn = decoder, fn or decoder
        self.device = device or next(decoder.model.parameters()).device
        self.tokens = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self.position = torch.zeros(1, dtype=torch.long, device=self.device)
        self.graph, self.out = None, None

    def prefill(self, prompt):
        """Empty the cache and run the prompt (uncompiled: a prompt is one forward, its own
        shapes): the logits that pick the first new token."""
        self.decoder.reset()
        return self.decoder(prompt, positions(0, prompt.shape[1], self.device))

    def capture(self, prompt, warmup=3, before=None):
        """Record the step as a CUDA graph: warm-up steps on a side stream (compiles and
        autotunes happen there), then before() and the capture. The cache is refilled by the
        next prefill."""
        self.prefill(prompt)
        self.position.fill_(prompt.shape[1])
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.warm_up(warmup)
        torch.cuda.current_stream().wait_stream(stream)
        if before:
            before()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self.fn(self.tokens, self.position)

    def warm_up(self, steps):
        """Steps at the current position, the first uncompiled: what a swap works out only in
        eager steps (transformers' cos/sin layout at the step's shapes, weight copies) is then
        there for torch.compile's trace, which would otherwise fall back to torch for it or
        compile again for every layer."""
        for i in range(steps):
            (self.decoder if i == 0 else self.fn)(self.tokens, self.position)

    def __call__(self, token, position):
        """token [B] (long, on the device), position int -> this step's logits [B, V]."""
        self.tokens.copy_(token[:, None])
        self.position.fill_(position)
        if self.graph is None:
            return self.fn(self.tokens, self.position)
        self.graph.replay()
        return self.out


class Reference:
    """The original's greedy generation: tokens [B, new] fed to the decode steps (the first
    picked by the prompt's logits) and logits [new + 1, B, V] (the prompt's, then each step's)."""

    def __init__(self, tokens, logits):
        self.tokens, self.logits = tokens, logits


def greedy(decoder, prompt, new, progress=None):
    step = Step(decoder, prompt.shape[0])
    logits = [step.prefill(prompt)]
    tokens = []
    for i in range(new):
        tokens.append(logits[-1].argmax(-1))
        logits.append(step(tokens[-1], prompt.shape[1] + i).clone())
        if progress:
            progress(i + 1, new)
    return Reference(torch.stack(tokens, 1), torch.stack(logits))


def teacher_forced(step, prompt, ref):
    """Feed the reference's tokens through `step` and compare each step's logits with the
    reference's as they come (nothing but the running verdict is kept): the prompt's logits
    are step 0. {"steps", "tolerance", "worst_rel_err", "worst_step", "decisive",
    "greedy_mismatches", "first_mismatch", "passed", "error"}."""
    dtype = ref.logits.dtype if ref.logits.dtype in E2E_TOLERANCE else torch.float32
    tol = E2E_TOLERANCE[dtype]
    result = {"steps": ref.logits.shape[0], "tolerance": tol, "worst_rel_err": 0.0,
              "worst_step": None, "decisive": 0, "greedy_mismatches": 0, "first_mismatch": None,
              "passed": False, "error": None}
    got = step.prefill(prompt)
    for i in range(ref.logits.shape[0]):
        if i:
            got = step(ref.tokens[:, i - 1], prompt.shape[1] + i - 1)
        rel, decisive, wrong = _step_agreement(got, ref.logits[i], tol)
        if rel is None:
            result["error"] = f"step {i}: logits have inf/nan where the original's have none"
            return result
        if rel > result["worst_rel_err"]:
            result.update(worst_rel_err=rel, worst_step=i)
        result["decisive"] += decisive
        result["greedy_mismatches"] += wrong
        if (rel > tol or wrong) and result["first_mismatch"] is None:
            result["first_mismatch"] = i
    result["passed"] = result["first_mismatch"] is None
    if not result["passed"]:
        i = result["first_mismatch"]
        result["error"] = (f"step {i} of {result['steps'] - 1}: logits differ from the "
                           f"original's by {result['worst_rel_err']:.2e} of their scale (at "
                           f"most {tol:g}) or pick another token where the original's is clear")
    return result


def _step_agreement(got, want, tol):
    """One step's logits [B, V] against the original's: the error relative to the step's
    largest logit, how many sequences had a clear winner (top-1 ahead of top-2 by more than the
    tolerance band) and in how many of those `got` picked another token. rel None: got has
    inf/nan where want has none."""
    a, b = got.float(), want.float()
    if not torch.isfinite(a).all() and torch.isfinite(b).all():
        return None, 0, 0
    scale = b.abs().nan_to_num(0.0).max().item()
    rel = (a - b).abs().nan_to_num(0.0).max().item() / (scale or 1.0)
    top2 = b.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > tol * scale
    wrong = clear & (a.argmax(-1) != b.argmax(-1))
    return rel, int(clear.sum()), int(wrong.sum())


def time_decode(step, prompt, ref, repeat):
    """Median seconds of the reference's decode steps (the prefill untimed), over `repeat`
    runs, each timed as a whole with CUDA events (perf_counter on a CPU)."""
    times = []
    new = ref.tokens.shape[1]
    for _ in range(repeat):
        step.prefill(prompt)
        sync()
        if autokernel.CUDA:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
        t0 = time.perf_counter()
        for i in range(new):
            step(ref.tokens[:, i], prompt.shape[1] + i)
        if autokernel.CUDA:
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def weight_bytes(model):
    """Bytes of the weights a decode step reads: every parameter once (tied ones once), except
    an embedding table only looked up (B rows a step), not also the output projection."""
    by_ptr = {}
    for p in model.parameters():
        by_ptr[p.data_ptr()] = p.numel() * p.element_size()
    lookups = {m.weight.data_ptr() for m in model.modules()
               if isinstance(m, torch.nn.Embedding)}
    used = {m.weight.data_ptr() for m in model.modules()
            if isinstance(m, torch.nn.Linear)}
    return sum(n for ptr, n in by_ptr.items() if ptr not in lookups or ptr in used)


def step_bytes(decoder, prompt_len, new):
    """The fewest bytes an average decode step must read: the weights, and the cache's live
    positions (step i reads prompt_len + i + 1 of them; the static cache's unused tail is not
    needed)."""
    tensors = decoder.cache_tensors()
    max_len = tensors[0].shape[2] if tensors else 1
    per_position = sum(t.numel() * t.element_size() for t in tensors) / max_len
    return weight_bytes(decoder.model) + per_position * (prompt_len + (new + 1) / 2)
