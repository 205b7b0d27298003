"""
Building blocks shared by the models that are not a single torch function. verify.py swaps them
by class and attributes, so their names and attributes are a contract:

  RMSNorm(dim, eps=1e-6)               .weight [dim], .eps
  SwiGLU(dim, hidden)                  .w_gate, .w_up (dim -> hidden), .w_down (hidden -> dim), no bias
  RotaryEmbedding(head_dim, max_seq)   .cos, .sin float32 [max_seq, head_dim/2], half-split rotation

Everything else is written with the torch/F function verify.py intercepts (F.linear,
F.layer_norm, F.scaled_dot_product_attention, F.softmax, F.cross_entropy, torch.sum).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight, computed in float32 and cast back to x's dtype."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * self.weight.float()).to(x.dtype)


class SwiGLU(nn.Module):
    """LLaMA's feed-forward: w_down(silu(w_gate(x)) * w_up(x))."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.w_gate = nn.Linear(dim, hidden, bias=False)
        self.w_up = nn.Linear(dim, hidden, bias=False)
        self.w_down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class RotaryEmbedding(nn.Module):
    """Rotary position embedding with half-split pairing (x[..., :D/2] rotates with x[..., D/2:],
    as LLaMA in transformers does).

    The tables are REAL float32 buffers, never a complex one: `.half()` casts a complex buffer to
    a real dtype and silently drops its imaginary part (the sin half of every rotation). They are
    also rebuilt in float32 whenever the module is moved or cast, so a `.half()` model keeps exact
    tables and casts them to x's dtype only at use."""

    def __init__(self, head_dim, max_seq, base=10000.0):
        super().__init__()
        assert head_dim % 2 == 0, "rotary head_dim must be even"
        self.head_dim, self.max_seq, self.base = head_dim, max_seq, base
        cos, sin = self._tables(torch.device("cpu"))
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _tables(self, device):
        # float64 angles: positions up to max_seq times frequencies lose digits in float32.
        dtype = torch.float64 if device.type != "mps" else torch.float32
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2, device=device,
                                                     dtype=dtype) / self.head_dim))
        angles = torch.outer(torch.arange(self.max_seq, device=device, dtype=dtype), inv_freq)
        return angles.cos().float(), angles.sin().float()

    def _apply(self, fn, *args, **kwargs):
        super()._apply(fn, *args, **kwargs)
        # Whatever fn did to the dtype (.half(), .to(bf16)), keep float32 tables on the new device.
        if self.cos.dtype != torch.float32:
            self.cos, self.sin = self._tables(self.cos.device)
        return self

    def forward(self, x, offset=0, positions=None):
        """x: [B, H, S, D]; positions offset .. offset+S-1, or `positions` (an int tensor [S] on
        x's device: a decode step's, read on the device so the step can be a CUDA graph)."""
        S, half = x.shape[-2], x.shape[-1] // 2
        rows = slice(offset, offset + S) if positions is None else positions
        cos = self.cos[rows].to(x.dtype)
        sin = self.sin[rows].to(x.dtype)
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def init_weights(module, std=0.02):
    """GPT-2/LLaMA style init: normal(0, 0.02) for projections and embeddings, zero biases."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)


def token_inputs(batch, seq, vocab_size, device="cpu", generator=None):
    """Random token ids [batch, seq] (int64)."""
    return torch.randint(0, vocab_size, (batch, seq), device=device, generator=generator)
