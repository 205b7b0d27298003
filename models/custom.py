"""
Template for your own model. Copy this file, change the modules, keep the four names profile.py
and verify.py look for:

    CONFIGS             name -> config (the first is the default; pick one with --config)
    Model               the nn.Module class (or pass --class-name)
    DEFAULT_INPUT_SHAPE (batch, seq) used on a GPU when --input-shape is not given
    get_inputs(batch, seq, device="cpu")  the forward's arguments, as a tuple

    uv run profile.py --model models/custom.py --input-shape 8x512

This one is a small causal language model that computes its own loss, written to exercise the
ops the other shipped models don't: attention spelled out with an explicit F.softmax over the last
dim, a last-dim reduction torch.sum(x, dim=-1) (a per-token gate), and F.cross_entropy.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.layers import init_weights, token_inputs


@dataclass
class CustomConfig:
    vocab_size: int = 16384
    max_seq: int = 1024
    n_layer: int = 4
    n_head: int = 8
    dim: int = 512
    eps: float = 1e-5


CONFIGS = {"default": CustomConfig()}
DEFAULT_INPUT_SHAPE = (8, 512)


class ExplicitAttention(nn.Module):
    """Causal attention written out: scores, mask, F.softmax, weighted sum."""

    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x):
        B, S, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = (t.view(B, S, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.n_head)
        causal = torch.ones(S, S, dtype=torch.bool, device=x.device).triu(1)
        probs = F.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
        return self.proj((probs @ v).transpose(1, 2).reshape(B, S, C))


class GatedBlock(nn.Module):
    """Pre-norm block whose MLP output is scaled per token by sigmoid(sum(h * g, dim=-1))."""

    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.dim, eps=cfg.eps)
        self.attn = ExplicitAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.dim, eps=cfg.eps)
        self.fc = nn.Linear(cfg.dim, 4 * cfg.dim)
        self.out = nn.Linear(4 * cfg.dim, cfg.dim)
        self.gate = nn.Parameter(torch.randn(cfg.dim) * cfg.dim ** -0.5)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        h = self.ln_2(x)
        gate = torch.sigmoid(torch.sum(h * self.gate, dim=-1)).unsqueeze(-1)
        return x + gate * self.out(F.gelu(self.fc(h)))


class CustomModel(nn.Module):
    def __init__(self, cfg: CustomConfig = CustomConfig()):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos = nn.Embedding(cfg.max_seq, cfg.dim)
        self.blocks = nn.ModuleList(GatedBlock(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.dim, eps=cfg.eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        init_weights(self)

    def forward(self, idx, targets=None):
        S = idx.shape[1]
        if S > self.config.max_seq:
            raise ValueError(f"sequence length {S} exceeds max_seq {self.config.max_seq}")
        x = self.embed(idx) + self.pos(torch.arange(S, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


Model = CustomModel


def get_inputs(batch, seq, device="cpu", config=CONFIGS["default"]):
    """Token ids and next-token targets: forward returns the loss."""
    tokens = token_inputs(batch, seq + 1, config.vocab_size, device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
