"""
BERT-base (110M parameters, plus the masked-LM head), self-contained.

    from models.bert import BERT, CONFIGS, get_inputs
    model = BERT(CONFIGS["base"]); logits = model(*get_inputs(2, 128))

Post-LayerNorm encoder blocks, bidirectional (non-causal) SDPA attention, exact (erf) GELU, and
the masked-LM head (dense, GELU, LayerNorm, decoder tied to the word embedding), so forward
returns logits over the vocabulary. LayerNorm eps is BERT's own 1e-12, not the layernorm kernel
contract's 1e-5: swapping a contract kernel in changes the model's math (slightly).
"""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.layers import init_weights, token_inputs


@dataclass
class BERTConfig:
    vocab_size: int = 30522
    max_seq: int = 512
    type_vocab_size: int = 2
    n_layer: int = 12
    n_head: int = 12
    dim: int = 768
    hidden: int = 3072
    eps: float = 1e-12


CONFIGS = {"base": BERTConfig()}
DEFAULT_INPUT_SHAPE = (32, 512)


class SelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.query = nn.Linear(cfg.dim, cfg.dim)
        self.key = nn.Linear(cfg.dim, cfg.dim)
        self.value = nn.Linear(cfg.dim, cfg.dim)
        self.out = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x):
        B, S, C = x.shape
        q, k, v = (w(x).view(B, S, self.n_head, C // self.n_head).transpose(1, 2)
                   for w in (self.query, self.key, self.value))
        y = F.scaled_dot_product_attention(q, k, v)  # bidirectional: no causal mask
        return self.out(y.transpose(1, 2).reshape(B, S, C))


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attention = SelfAttention(cfg)
        self.attention_norm = nn.LayerNorm(cfg.dim, eps=cfg.eps)
        self.intermediate = nn.Linear(cfg.dim, cfg.hidden)
        self.output = nn.Linear(cfg.hidden, cfg.dim)
        self.output_norm = nn.LayerNorm(cfg.dim, eps=cfg.eps)

    def forward(self, x):
        x = self.attention_norm(x + self.attention(x))
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


class BERT(nn.Module):
    def __init__(self, cfg: BERTConfig = BERTConfig()):
        super().__init__()
        self.config = cfg
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.position_embeddings = nn.Embedding(cfg.max_seq, cfg.dim)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.dim)
        self.embeddings_norm = nn.LayerNorm(cfg.dim, eps=cfg.eps)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_layer))
        self.head_dense = nn.Linear(cfg.dim, cfg.dim)
        self.head_norm = nn.LayerNorm(cfg.dim, eps=cfg.eps)
        self.head_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        init_weights(self)

    def forward(self, input_ids, token_type_ids=None):
        S = input_ids.shape[1]
        if S > self.config.max_seq:
            raise ValueError(f"sequence length {S} exceeds BERT's max_seq {self.config.max_seq}")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        pos = torch.arange(S, device=input_ids.device)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(pos)
             + self.token_type_embeddings(token_type_ids))
        x = self.embeddings_norm(x)
        for layer in self.layers:
            x = layer(x)
        h = self.head_norm(F.gelu(self.head_dense(x)))
        return F.linear(h, self.word_embeddings.weight, self.head_bias)  # decoder tied to the embedding


Model = BERT


def get_inputs(batch, seq, device="cpu", config=CONFIGS["base"]):
    return (token_inputs(batch, seq, config.vocab_size, device),)
