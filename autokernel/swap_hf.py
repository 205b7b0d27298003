"""
The swap's patches of transformers: its models' own functions and attention layers, each
patched only where the installed version looks the way these patches expect.

    rotary_patches  apply_rotary_pos_emb of LLaMA-style models (and their partial rotary) runs
                    the rotary_embedding kernel
    qkv_patches     attention layers whose q/k/v projections and rotary run as one qkv_rotary
                    call, the layer's own forward kept (masks, caches, attention backends)
    mask_patches    masking_utils lets SDPA's is_causal mask where the eager forward would, so a
                    compiled forward reaches the flash_attention kernel
    gqa_patches     a decode step's grouped-query attention reaches decode_attention with the
                    cache's own key/value heads, not copies repeated to every query head

A patcher gets (swap, model) and returns [(owner, attribute, replacement)].
"""
import functools
import inspect
import sys
import weakref

import torch
import torch.nn as nn

from autokernel import computed
from autokernel.cli import describe
from autokernel.kernel_call import FLOAT_DTYPES
from autokernel.patching import applying, capturing
from autokernel.recognize import DECODE_MAX_QUERIES
from autokernel.swap_modules import (UNEQUAL_QKV, cat_qkv, probed, random_copy, stackable,
                                     stacked_qkv)


class _HalfTables:
    """transformers' cos/sin are [B, S, D] with the [S, D/2] table duplicated along the last dim
    and repeated over the batch. Check that once per table object and keep the [S, D/2] halves.
    The check reads values back (a sync), which a CUDA graph capture forbids and torch.compile
    cannot trace: there the verdict of the eager forwards at the same shapes is reused (the
    tables are rebuilt every forward, the same way), and with none the call falls back to torch."""

    def __init__(self):
        self.cache = {}
        self.verdicts = {}  # (shape, dtype) of the tables -> all checked so far had the layout

    def get(self, cos, sin, dtype):
        tracing = torch.compiler.is_compiling()
        hit = None if tracing else self.cache.get(id(cos))
        if hit and hit[0]() is cos and hit[1]() is sin:
            return hit[2]
        halves = None
        if cos.dim() in (2, 3) and cos.shape == sin.shape and cos.shape[-1] % 2 == 0:
            c, s = (t.reshape(-1, *t.shape[-2:]) for t in (cos, sin))
            h = c.shape[-1] // 2
            key = (tuple(cos.shape), cos.dtype)
            if capturing():  # tracing included: no value read back steers a trace
                ok = self.verdicts.get(key, False)
            else:
                ok = all(torch.equal(t[..., :h], t[..., h:]) and torch.equal(t, t[:1].expand_as(t))
                         for t in (c, s))
                self.verdicts[key] = self.verdicts.get(key, True) and ok
            if ok:
                halves = tuple(t[0, :, :h].to(dtype).contiguous() for t in (c, s))
        if not tracing:
            self.cache[id(cos)] = (weakref.ref(cos), weakref.ref(sin), halves)
        return halves


def rotary_patches(swap, model):
    """Patch apply_rotary_pos_emb in the transformers modules the model's classes come from
    (LLaMA and the models that copy its half-split rotate_half), restored on exit. Tables
    narrower than the heads (GPT-NeoX's rotary_pct: the first dims turn, the rest pass through)
    take the kernel on those dims, once the model's own function has agreed on the first eager
    call at that shape (a copy of LLaMA's would not broadcast there at all)."""
    patches = []
    for owner in _hf_rotary_owners(model):
        original, tables, partial = owner.apply_rotary_pos_emb, _HalfTables(), {}

        def apply_rotary_pos_emb(q, k, cos, sin, *args, _original=original, _tables=tables,
                                 _partial=partial, **kwargs):
            if not swap.active("rotary_embedding"):
                return _original(q, k, cos, sin, *args, **kwargs)
            unsqueeze_dim = kwargs.get("unsqueeze_dim", 1)
            turned = cos.shape[-1]
            usable = not args and set(kwargs) <= {"unsqueeze_dim"} and unsqueeze_dim == 1 \
                and q.dim() == 4 and k.dim() == 4 and q.dtype in FLOAT_DTYPES \
                and k.dtype == q.dtype and k.shape[-1] == q.shape[-1] >= turned \
                and q.shape[-2] == cos.shape[-2] and k.shape[-2] == cos.shape[-2]
            halves = _tables.get(cos, sin, q.dtype) if usable else None
            if halves is None:
                swap.fallback("rotary_embedding", "cos/sin not the shared half-duplicated tables")
                return _original(q, k, cos, sin, *args, **kwargs)
            c, s = halves
            if turned == q.shape[-1]:
                return (swap.run("rotary_embedding", x=q.contiguous(), cos=c, sin=s),
                        swap.run("rotary_embedding", x=k.contiguous(), cos=c, sin=s))
            key = (tuple(q.shape), tuple(k.shape), turned, q.dtype)
            agreed = _partial.get(key)
            if agreed is None and capturing():  # no value read back can steer a trace
                swap.fallback("rotary_embedding", "partial rotary at a shape no eager call checked")
                return _original(q, k, cos, sin, **kwargs)
            differs = "partial rotary: the model's function differs"
            if agreed is False:
                swap.fallback("rotary_embedding", differs)
                return _original(q, k, cos, sin, **kwargs)
            ours = tuple(torch.cat([swap.run("rotary_embedding", x=t[..., :turned].contiguous(),
                                             cos=c, sin=s), t[..., turned:]], dim=-1)
                         for t in (q, k))
            if agreed is None:
                theirs = _original(q, k, cos, sin, **kwargs)
                _partial[key] = agreed = all(computed.agrees(o, w, q.dtype)
                                             for o, w in zip(ours, theirs))
                if not agreed:
                    swap.fallback("rotary_embedding", differs)
                    return theirs
            return ours
        patches.append((owner, "apply_rotary_pos_emb", _passing_on(apply_rotary_pos_emb, swap)))
    return patches


def _passing_on(apply, flag):
    """apply_rotary_pos_emb that, once flag.qk_rotated is set (a qkv_rotary kernel rotated the
    layer's q and k on their way in, qkv_patches), hands q and k back as they are and clears
    it; apply otherwise."""
    def apply_rotary_pos_emb(q, k, *args, **kwargs):
        if flag.qk_rotated:
            flag.qk_rotated = False
            return q, k
        return apply(q, k, *args, **kwargs)
    return apply_rotary_pos_emb


def _hf_rotary_owners(model):
    """The transformers modules the model's classes come from that define LLaMA's half-split
    apply_rotary_pos_emb (and rotate_half)."""
    owners = {sys.modules.get(type(m).__module__) for m in model.modules()}
    return [o for o in owners if o is not None and o.__name__.startswith("transformers.")
            and callable(getattr(o, "apply_rotary_pos_emb", None)) and hasattr(o, "rotate_half")]


# transformers' attention layers run their q/k/v projections and rotary as one qkv_rotary call:
# the layer's own forward still runs (masks, caches, attention backends, sliding windows stay
# transformers'), its projections answer from the kernel's output made on entry, and its
# apply_rotary_pos_emb passes the rotated q and k on. Confirmed once per class and shapes on a
# probe input against the layer as it is (a norm on q/k before the rotary, Qwen3's, differs).
def qkv_patches(swap, model):
    owners = {o.__name__: o for o in _hf_rotary_owners(model)}
    patches = []
    for module in model.modules():
        owner = owners.get(type(module).__module__)
        found = _hf_projections(module) if owner is not None else None
        if found is None:
            continue
        if isinstance(found, str):
            swap.skipped["qkv_rotary"][found] += 1
            continue
        refused = probed(module, found[0], lambda: _hf_qkv_mismatch(module, owner))
        if refused:
            swap.skipped["qkv_rotary"][refused] += 1
            continue
        patches += _hf_qkv_forwards(module, found, swap, lambda ps: stacked_qkv(swap, *ps),
                                    functools.partial(swap.run, "qkv_rotary"),
                                    functools.partial(swap.fallback, "qkv_rotary"))
    if patches and not swap.active("rotary_embedding"):
        patches += rotary_patches(swap, model)  # for its pass-through of rotated q and k
    return patches


def _hf_projections(module):
    """(projections, Hq, Hkv) of a transformers attention layer: q_proj, k_proj and v_proj, or
    one qkv_proj (Phi-3) whose rows are q's, k's and v's; None if it is not one, or why not."""
    D = getattr(module, "head_dim", None)
    if not isinstance(D, int) or not isinstance(getattr(module, "o_proj", None), nn.Linear) \
            or "position_embeddings" not in inspect.signature(module.forward).parameters:
        return None
    separate = [getattr(module, a, None) for a in ("q_proj", "k_proj", "v_proj")]
    if all(isinstance(p, nn.Linear) for p in separate):
        projections = separate
        Hq, Hkv = separate[0].weight.shape[0] // D, separate[1].weight.shape[0] // D
    elif isinstance(getattr(module, "qkv_proj", None), nn.Linear):
        projections = [module.qkv_proj]
        config = getattr(module, "config", None)
        Hq = getattr(config, "num_attention_heads", 0)
        Hkv = getattr(config, "num_key_value_heads", None) or Hq
    else:
        return None
    if D % 2 or not stackable(projections, D) \
            or sum(p.weight.shape[0] for p in projections) != (Hq + 2 * Hkv) * D or Hq == 0:
        return UNEQUAL_QKV
    return projections, Hq, Hkv


def _hf_qkv_forwards(module, found, flag, stacked, run, fallback):
    """The patches that make `module` (a transformers attention layer whose projections are
    found = _hf_projections(module)) take q, k and v from one run(x=..., w_qkv=..., ...) ->
    [B, S, Hq + 2 Hkv, D]; flag.qk_rotated tells its apply_rotary_pos_emb that q and k are
    rotated already."""
    projections, Hq, Hkv = found
    w = projections[0].weight
    D = module.head_dim
    original, tables, stash = module.forward, _HalfTables(), {}

    def forward(hidden_states, position_embeddings=None, *args, **kwargs):
        x, pe = hidden_states, position_embeddings
        usable = isinstance(pe, tuple) and len(pe) == 2 and isinstance(x, torch.Tensor) \
            and x.dim() == 3 and x.dtype == w.dtype and x.dtype in FLOAT_DTYPES \
            and not module.training and pe[0].shape[-1] == D and pe[0].shape[-2] == x.shape[1]
        halves = tables.get(*pe, x.dtype) if usable else None
        if halves is None:
            fallback("cos/sin not the shared half-duplicated tables of the heads")
            return original(hidden_states, position_embeddings, *args, **kwargs)
        weights, bias = stacked(projections)
        qkv = run(x=x, w_qkv=weights, cos=halves[0], sin=halves[1], kv_heads=Hkv, bias=bias)
        # [B, S, heads, D] slices seen as [B, S, heads * D]: what the layer's .view(B, S, -1, D)
        # .transpose(1, 2) turns back into the kernel's layout, with no copy
        parts = qkv.split([Hq, Hkv, Hkv], dim=2) if len(projections) == 3 else (qkv,)
        for i, t in enumerate(parts):
            stash[i] = (x, t.flatten(2))
        flag.qk_rotated = True
        try:
            return original(hidden_states, position_embeddings, *args, **kwargs)
        finally:
            stash.clear()
            flag.qk_rotated = False

    def answering(i):
        plain = projections[i].forward

        def projection(x):
            entry = stash.pop(i, None)  # answered for the layer's input only (not, say, a
            return entry[1] if entry is not None and entry[0] is x else plain(x)  # cross-input)
        return projection
    return [(module, "forward", forward)] + [(p, "forward", answering(i))
                                             for i, p in enumerate(projections)]


def _hf_qkv_mismatch(layer, owner):
    """None when the layer with _hf_qkv_forwards (the eager reference as the kernel) computes what
    it computes alone on a probe input (a random copy of the layer: random_copy), else why
    not."""
    import types

    from autokernel import reference
    gen = torch.Generator().manual_seed(0)
    module = random_copy(layer, gen)
    found = _hf_projections(module)
    w = found[0][0].weight
    D, S = module.head_dim, 16
    x = torch.randn((2, S, w.shape[1]), generator=gen).to(w)
    half = torch.randn((S, D // 2), generator=gen)
    cos, sin = (f(torch.cat([half, half], -1)).expand(2, S, D).contiguous().to(w)
                for f in (torch.cos, torch.sin))
    flag = types.SimpleNamespace(qk_rotated=False)
    patches = _hf_qkv_forwards(module, found, flag, cat_qkv,
                               lambda **inputs: reference.qkv_rotary_eager(**inputs),
                               lambda reason: None)
    patches.append((owner, "apply_rotary_pos_emb",
                    _passing_on(owner.apply_rotary_pos_emb, flag)))
    try:
        with torch.no_grad():
            want = module(x, position_embeddings=(cos, sin), attention_mask=None)
            with applying(patches):
                got = module(x, position_embeddings=(cos, sin), attention_mask=None)
    except Exception as e:  # noqa: BLE001
        return f"skipped: the layer's forward raised {describe(e, 80)}"
    want, got = (t[0] if isinstance(t, tuple) else t for t in (want, got))
    if not isinstance(got, torch.Tensor) or not computed.agrees(got, want, w.dtype):
        return "skipped: q/k/v are not the projections rotated by apply_rotary_pos_emb " \
            "(probe mismatch)"
    return None


def mask_patches(swap, model):
    """transformers lets SDPA's is_causal do the masking when nothing is padded, and builds a full
    mask otherwise (which no flash kernel takes). While dynamo traces, torch before 2.14 answers
    torch.compiler.is_exporting() with True, so transformers builds the mask in every compiled
    forward. Where its skip depends on shapes alone (no padding mask, no sliding window reached,
    an int offset: a tensor one means a static cache), the patched checks answer as the eager
    forward does; otherwise, or where transformers' signature is not the one known here, the
    original decides."""
    masking = sys.modules.get("transformers.masking_utils")
    if masking is None:
        return []

    def no_window(kv_length, local_attention_size):
        return local_attention_size is None or kv_length < local_attention_size

    def ignore_causal(padding_mask, q_length, kv_length, q_offset, kv_offset,
                      local_attention_size=None, _original=None):
        if padding_mask is None and not isinstance(q_offset, torch.Tensor) \
                and no_window(kv_length, local_attention_size):
            return q_length == 1 or kv_length == q_length
        return _original(padding_mask, q_length, kv_length, q_offset, kv_offset,
                         local_attention_size)

    def ignore_bidirectional(padding_mask, kv_length, local_attention_size=None, _original=None):
        if padding_mask is None and no_window(kv_length, local_attention_size):
            return True
        return _original(padding_mask, kv_length, local_attention_size)

    patches = []
    for name, check in (("_ignore_causal_mask_sdpa", ignore_causal),
                        ("_ignore_bidirectional_mask_sdpa", ignore_bidirectional)):
        original = getattr(masking, name, None)
        known = list(inspect.signature(check).parameters)[:-1]
        if callable(original) and list(inspect.signature(original).parameters) == known:
            patches.append((masking, name, functools.partial(check, _original=original)))
    return patches + _hf_packed_patches(masking, model)


def _hf_packed_patches(masking, model):
    """With no attention mask, transformers looks for packed sequences (positions restarting
    inside a row) by reading position_ids: a value read that dynamo cannot trace, so every
    compiled forward builds the full mask. Where the model numbered the tokens itself (the
    caller passed no position_ids: the model's forward takes arange + past length), no row is
    packed, and the patched check says so without reading anything; position_ids the caller
    passed are still read by the original check."""
    original = getattr(masking, "find_packed_sequence_indices", None)
    if not callable(original):
        return []
    numbered = []  # one entry per mask-building forward running: did it number the tokens?

    def find_packed_sequence_indices(position_ids):
        return None if numbered and numbered[-1] else original(position_ids)

    def numbering(forward, index):
        def wrapper(*args, **kwargs):
            given = args[index] if len(args) > index else kwargs.get("position_ids")
            numbered.append(given is None)
            try:
                return forward(*args, **kwargs)
            finally:
                numbered.pop()
        return wrapper

    patches = []
    for module in model.modules():  # the forwards that build the mask from their position_ids
        code = getattr(inspect.unwrap(type(module).forward), "__code__", None)
        if code is None or "create_causal_mask" not in code.co_names:
            continue  # most modules: skipped before any signature is read
        params = list(inspect.signature(module.forward).parameters)
        if "position_ids" in params:
            patches.append((module, "forward", numbering(module.forward,
                                                         params.index("position_ids"))))
    if not patches:
        return []
    return patches + [(masking, "find_packed_sequence_indices", find_packed_sequence_indices)]


def gqa_patches(swap, model):
    """transformers hands SDPA grouped-query keys and values as they are (enable_gqa) only where
    no mask is passed; with a mask, as at every step over a static cache, it copies the whole
    cache to every query head first (repeat_kv; transformers 5.23's eager step folds the heads
    into the query instead, its compiled step still copies). At Llama-3.2-1B's 4 query heads a
    KV head that copy moves 5x the cache's bytes a layer and makes the attention read 4x them.
    decode_attention takes the KV heads as they are, so while it is active a decode step's SDPA
    gets them with enable_gqa (decode_gqa); a call the kernel then refuses still computes the
    same in torch (SDPA broadcasts the heads itself)."""
    return decode_gqa(lambda: swap.active("decode_attention"))


def decode_gqa(enabled):
    """[(transformers' SDPA integration, "use_gqa_in_sdpa", a check that answers yes for a decode
    step's mask, at most DECODE_MAX_QUERIES queries over a longer cache, while enabled())], or
    [] where transformers has no such check. A prefill and any other call: the original decides.
    verify.py --generate also times torch.compile with it (the best it does with such a model)."""
    sdpa = sys.modules.get("transformers.integrations.sdpa_attention")
    original = getattr(sdpa, "use_gqa_in_sdpa", None)
    if not callable(original):
        return []

    def use_gqa_in_sdpa(attention_mask, *args, **kwargs):
        if enabled() and isinstance(attention_mask, torch.Tensor) \
                and attention_mask.dim() in (2, 4) \
                and attention_mask.shape[-2] <= DECODE_MAX_QUERIES \
                and attention_mask.shape[-2] < attention_mask.shape[-1]:
            return True
        return original(attention_mask, *args, **kwargs)
    return [(sdpa, "use_gqa_in_sdpa", use_gqa_in_sdpa)]
