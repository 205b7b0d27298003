"""
LLaMA, self-contained, in two presets of one class: "compact" (~162M parameters, for quick
nights) and "7b" (the LLaMA-7B configuration: 6.7B parameters, build it on a GPU or on the meta
device).

    from models.llama import LLaMA, CONFIGS, get_inputs
    model = LLaMA(CONFIGS["compact"]); logits = model(*get_inputs(2, 128))

RMSNorm pre-norm blocks, rotary positions (real float32 cos/sin tables, half-split pairing),
causal SDPA attention, SwiGLU feed-forward, untied lm_head.
"""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.layers import RMSNorm, RotaryEmbedding, SwiGLU, init_weights, token_inputs


@dataclass
class LLaMAConfig:
    vocab_size: int = 32000
    max_seq: int = 2048
    n_layer: int = 12
    n_head: int = 12
    dim: int = 768
    hidden: int = 3072      # SwiGLU width
    eps: float = 1e-6       # RMSNorm eps (the rmsnorm kernel contract's)
    rope_base: float = 10000.0


CONFIGS = {
    "compact": LLaMAConfig(),
    "7b": LLaMAConfig(vocab_size=32000, max_seq=2048, n_layer=32, n_head=32, dim=4096,
                      hidden=11008),
}
DEFAULT_INPUT_SHAPE = (8, 1024)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.dim // cfg.n_head
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.rotary = RotaryEmbedding(self.head_dim, cfg.max_seq, cfg.rope_base)

    def forward(self, x, cache=None, positions=None):
        B, S, C = x.shape
        q, k, v = (w(x).view(B, S, self.n_head, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        if cache is None:
            q, k = self.rotary(q), self.rotary(k)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # generation: this step's keys/values join the cache, queries read all of it
            q, k = self.rotary(q, positions=positions), self.rotary(k, positions=positions)
            k, v = cache.update(positions, k, v)
            visible = torch.arange(k.shape[2], device=x.device) <= positions[:, None]  # causal
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=visible)
        return self.wo(y.transpose(1, 2).reshape(B, S, C))


class KVCache(nn.Module):
    """A static key/value cache [B, H, max_len, D] for generation: a step writes its positions
    in place (index_copy_ at a device tensor of positions), so every step has the same shapes
    and one CUDA graph replays any of them. Positions not written yet are masked out."""

    def __init__(self, batch, heads, max_len, head_dim, dtype, device):
        super().__init__()
        shape = (batch, heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device))
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device))

    def update(self, positions, k, v):
        self.k.index_copy_(2, positions, k)
        self.v.index_copy_(2, positions, v)
        return self.k, self.v


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.eps)
        self.mlp = SwiGLU(cfg.dim, cfg.hidden)

    def forward(self, x, cache=None, positions=None):
        x = x + (self.attn(self.attn_norm(x)) if cache is None else
                 self.attn(self.attn_norm(x), cache, positions))
        return x + self.mlp(self.mlp_norm(x))


class LLaMA(nn.Module):
    def __init__(self, cfg: LLaMAConfig = LLaMAConfig()):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if not self.embed.weight.is_meta:
            init_weights(self)

    def new_cache(self, batch, max_len):
        """One KVCache per block, for forward(idx, cache=..., positions=...)."""
        cfg, w = self.config, self.lm_head.weight
        if max_len > cfg.max_seq:
            raise ValueError(f"cache length {max_len} exceeds max_seq {cfg.max_seq}")
        return nn.ModuleList(KVCache(batch, cfg.n_head, max_len, cfg.dim // cfg.n_head, w.dtype,
                                     w.device) for _ in self.blocks)

    def forward(self, idx, targets=None, cache=None, positions=None):
        """idx [B, S] -> logits [B, S, vocab]. Generation passes a new_cache() and the steps'
        positions (an int64 tensor [S] on the device); without them the whole sequence is one
        causal forward."""
        if idx.shape[1] > self.config.max_seq:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds max_seq {self.config.max_seq}")
        x = self.embed(idx)
        for i, block in enumerate(self.blocks):
            x = block(x) if cache is None else block(x, cache[i], positions)
        logits = self.lm_head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


Model = LLaMA


def get_inputs(batch, seq, device="cpu", config=CONFIGS["compact"]):
    return (token_inputs(batch, seq, config.vocab_size, device),)
