"""The model of the article series "Pretraining a Llama Model on Your Local GPU" (Machine Learning Mastery),
rebuilt for tests from its description: the same module tree, so the same state-dict keys, and the same maths.

``LlamaForPretraining`` holds the decoder as ``base_model`` (embedding, layers, final norm, and a rotary
module whose ``cos``/``sin`` tables are registered buffers, so they are saved with the weights) beside
``lm_head``. Norms are ``torch.nn.RMSNorm`` (eps 1e-5); attention is SDPA with an explicit causal mask and
``enable_gqa``; the rotary tables are cos/sin of positions × the inverse frequencies, duplicated to the
head size (base 10,000).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ArticleConfig:
    vocab_size: int = 512
    max_position_embeddings: int = 64
    hidden_size: int = 32
    intermediate_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    rope_base: float = 10_000.0


class RotaryTables(nn.Module):
    def __init__(self, head_dim: int, positions: int, base: float) -> None:
        super().__init__()
        inverse = 1.0 / (base ** (torch.arange(0, head_dim, 2) / head_dim))
        angles = torch.outer(torch.arange(positions), torch.cat((inverse, inverse)))
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, heads, head_dim)
        t = x.shape[1]
        cos, sin = self.cos[:t].view(1, t, 1, -1), self.sin[:t].view(1, t, 1, -1)
        first, second = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-second, first), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ArticleConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, rope: RotaryTables, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = rope(self.q_proj(x).view(b, t, self.heads, self.head_dim)).transpose(1, 2)
        k = rope(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ArticleConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ArticleConfig) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=1e-5)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=1e-5)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, rope: RotaryTables, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ArticleConfig) -> None:
        super().__init__()
        self.rotary_emb = RotaryTables(cfg.hidden_size // cfg.num_attention_heads, cfg.max_position_embeddings,
                                       cfg.rope_base)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=1e-5)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, self.rotary_emb, mask)
        return self.norm(x)


class LlamaForPretraining(nn.Module):
    def __init__(self, cfg: ArticleConfig) -> None:
        super().__init__()
        self.base_model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        causal = torch.full((t, t), float("-inf")).triu(diagonal=1)
        return self.lm_head(self.base_model(ids, causal))


def article_model(seed: int, **changes) -> LlamaForPretraining:
    """A randomly initialised article model (the micro shape of the other checkpoint tests by default)."""
    torch.manual_seed(seed)
    model = LlamaForPretraining(ArticleConfig(**changes)).eval()
    with torch.no_grad():  # non-trivial norms, so a load that mixes them up cannot pass
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model
