"""A Llama-style decoder whose parameter names, shapes and math are Hugging Face's.

``LlamaForCausalLM`` here and in ``transformers`` hold the same state dict
(``model.embed_tokens.weight``, ``model.layers.N.self_attn.q_proj.weight``, …,
``lm_head.weight``) and compute the same logits, so checkpoints move between
them without conversion.

Shapes in comments: B batch, T time, H hidden, N heads, K key/value heads, D head dim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from core.config import ModelConfig
from core.errors import NotFinite
from core.loss import token_loss_sum
from core.memory_budget import check_allocatable


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 like HF, then cast back before the weight.
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for rotary embeddings in HF's half-split layout."""

    def __init__(self, head_dim: int, max_positions: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)  # (T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (T, D)
        # Not persistent: derived from the config, never part of a checkpoint.
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, seq_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[:seq_len].to(dtype), self.sin[:seq_len].to(dtype)


def attention_in_fp32(q: torch.Tensor) -> bool:
    """Whether attention runs in fp32 under autocast: on a CPU, yes; elsewhere autocast's dtype (bf16 SDPA).

    Held in bf16 inside the kernel (the probabilities and their gradients),
    attention alone made bf16 training trail fp32 by 0.09 nats at tiny's
    16 × 128 over 300 steps (``python -m bench.numerics --attention bf16``),
    where rounding its inputs to bf16, the output head and the MLP in bf16 cost
    nothing measurable. And PyTorch's CPU attention kernel is slower in bf16 at
    short sequences: a tiny step is 1.31× faster for fp32 attention, a small one
    as fast, a base one at 1,024 positions 1.23× slower (``python -m
    bench.step_ab``, docs/benchmarks.md). GPUs keep bf16 flash attention.
    """
    return q.device.type == "cpu" and torch.is_autocast_enabled("cpu")


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, N, T, D)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, K, T, D)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, K, T, D)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if attention_in_fp32(q):
            # q and k are fp32 already (the rotation promotes them), v is widened exactly; o_proj's autocast
            # casts the output back to bf16.
            with torch.autocast(q.device.type, enabled=False):
                y = self._attend(q.float(), k.float(), v.float(), mask)
        else:
            y = self._attend(q, k, v, mask)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        gqa = self.num_kv_heads != self.num_heads
        if mask is None:
            # Query head i reads key/value head i // (N / K), as HF's repeat_kv; enable_gqa lets
            # SDPA do it without copying K and V per query head (HF's Llama does the same).
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        if gqa:  # with a mask, copy: not every device's fused kernel takes a mask and GQA together
            rep = self.num_heads // self.num_kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    """One pre-norm transformer block; the unit of per-block compilation."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)


Block = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def attention_mask_4d(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) real-token mask -> (B, 1, T, T) boolean mask: causal and no padded keys.

    Each position may always see itself, so no row is fully masked: a fully
    masked row gives NaN, and 0 × NaN would leak into real tokens at the next layer.
    """
    B, T = attention_mask.shape
    idx = torch.arange(T, device=attention_mask.device)
    causal = idx[None, :] <= idx[:, None]  # (T, T): key j visible from query i
    keys = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
    return (causal & keys) | torch.eye(T, dtype=torch.bool, device=attention_mask.device)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        check_allocatable(cfg)  # every model is built in RAM first: absurd sizes are one line, not an abort
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.reset_parameters()
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def reset_parameters(self) -> None:
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                blocks: Sequence[Block] | None = None, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V) for token ids (B, T); with ``targets`` (B, T), the summed loss instead.

        ``attention_mask`` (B, T), 1 for real tokens and 0 for padding, adds a
        padding mask to the causal one. ``blocks`` replaces the layers' call
        (per-block compiled wrappers of the same modules) without changing them.
        ``targets`` returns ``core.loss.token_loss_sum`` of the logits: the loss
        then belongs to the model's compiled graph (see core.loss).
        """
        B, T = input_ids.shape
        x = self.model.embed_tokens(input_ids)  # (B, T, H)
        cos, sin = self.model.rotary_emb(T, x.dtype)
        mask = None if attention_mask is None else attention_mask_4d(attention_mask)
        for layer in blocks if blocks is not None else self.model.layers:
            x = layer(x, cos, sin, mask)
        logits = self.lm_head(self.model.norm(x))
        return logits if targets is None else token_loss_sum(logits, targets)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, eos_id: int | None = None,
                 generator: torch.Generator | None = None,
                 on_token: Callable[[int], None] | None = None, vocab_limit: int | None = None) -> torch.Tensor:
        """Extend (1, T) token ids. ``temperature`` 0 is greedy; ``on_token`` gets each new id as it comes
        (a console prints the text as it grows). ``vocab_limit``: ids from it on are never chosen (an embedding
        with more rows than its tokenizer has tokens: such an id decodes to nothing).

        Weights that hold NaN or inf (a diverged run) are ``NotFinite``, not a
        sampler's RuntimeError or silent garbage.
        """
        for i in range(max_new_tokens):
            ctx = idx[:, -self.config.max_position_embeddings:]
            logits = self(ctx)[:, -1, :].float()
            # Host sync, once: damaged weights show at the first token already.
            if i == 0 and not bool(torch.isfinite(logits).all()):
                raise NotFinite("the model's outputs are not finite (NaN or inf): its weights are damaged, "
                                "or the training that made them diverged")
            if vocab_limit is not None and vocab_limit < logits.size(-1):
                logits[:, vocab_limit:] = float("-inf")
            if temperature <= 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                if top_k:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                # Shifted so the largest is 0, in float64: any positive temperature, however small or
                # large, gives finite probabilities (a tiny one tends to greedy, not to inf/inf = NaN).
                shifted = logits.double() - logits.max(dim=-1, keepdim=True).values.double()
                nxt = torch.multinomial(F.softmax(shifted / temperature, dim=-1), 1, generator=generator)
            idx = torch.cat((idx, nxt), dim=1)
            # Host sync per token: fine for short samples, and it stops at EOS.
            token = int(nxt[0, 0])
            if on_token is not None:
                on_token(token)
            if eos_id is not None and token == eos_id:
                break
        return idx
