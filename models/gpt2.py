"""
GPT-2 small (124M parameters), self-contained.

    from models.gpt2 import GPT2, CONFIGS, get_inputs
    model = GPT2(CONFIGS["small"]); logits = model(*get_inputs(2, 128))

Pre-LayerNorm blocks, learned positions, tanh-approximated GELU, causal SDPA attention, and an
lm_head tied to the token embedding, as in OpenAI's release.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.layers import init_weights, token_inputs


@dataclass
class GPT2Config:
    vocab_size: int = 50257
    max_seq: int = 1024
    n_layer: int = 12
    n_head: int = 12
    dim: int = 768
    eps: float = 1e-5


CONFIGS = {"small": GPT2Config()}
DEFAULT_INPUT_SHAPE = (8, 1024)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.c_proj = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x):
        B, S, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=-1)
        q, k, v = (t.view(B, S, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, S, C))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.dim, 4 * cfg.dim)
        self.act = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * cfg.dim, cfg.dim)

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.dim, eps=cfg.eps)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.dim, eps=cfg.eps)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, cfg: GPT2Config = GPT2Config()):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.wpe = nn.Embedding(cfg.max_seq, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.dim, eps=cfg.eps)
        init_weights(self)
        # GPT-2 scales the residual projections by 1/sqrt(2 * n_layer) at init.
        for block in self.blocks:
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * cfg.n_layer))

    def forward(self, idx, targets=None):
        S = idx.shape[1]
        if S > self.config.max_seq:
            raise ValueError(f"sequence length {S} exceeds GPT-2's max_seq {self.config.max_seq}")
        pos = torch.arange(S, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # lm_head tied to the embedding
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


Model = GPT2


def get_inputs(batch, seq, device="cpu", config=CONFIGS["small"]):
    return (token_inputs(batch, seq, config.vocab_size, device),)
