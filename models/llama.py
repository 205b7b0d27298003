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

    def forward(self, x):
        B, S, C = x.shape
        q, k, v = (w(x).view(B, S, self.n_head, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        q, k = self.rotary(q), self.rotary(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, S, C))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.eps)
        self.mlp = SwiGLU(cfg.dim, cfg.hidden)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
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

    def forward(self, idx, targets=None):
        if idx.shape[1] > self.config.max_seq:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds max_seq {self.config.max_seq}")
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


Model = LLaMA


def get_inputs(batch, seq, device="cpu", config=CONFIGS["compact"]):
    return (token_inputs(batch, seq, config.vocab_size, device),)
