"""How high can MFU go at a preset's shapes? The step's matmuls and attention timed alone.

    python -m bench.mfu_ceiling --preset small --precision bf16 --repeats 6

MFU divides a step's model FLOPs by the machine's matmul peak: the best of
large square GEMMs (``core.precision.matmul_peak``). A model's own GEMMs are
smaller and thinner than those, and its attention runs in a separate kernel,
so even a step that did nothing else would stay below 100%. This module times,
on tensors of the run's dtype (bf16 directly: autocast's casts are left out,
so the figure is an upper bound), one micro-batch's

- **GEMMs**: every ``nn.Linear`` of the model, forward and both backward
  matmuls (``F.linear(x, w).backward(g)``), with the micro-batch's rows;
- **attention**: ``scaled_dot_product_attention`` forward and backward at the
  model's heads, key/value heads, sequence length and head size (causal), as
  the model calls it: in fp32 on a CPU whatever the precision
  (``core.model.attention_in_fp32``);

and prints their FLOP/s and the MFU a step would reach if it spent its time on
them alone (GEMMs only, and GEMMs + attention). A measured run's MFU can then
be read against the ceiling, not only against the square-GEMM peak.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass

from bench.module_cli import int_at_least, module_parser, positive_number, run_module

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


@dataclass(frozen=True)
class Ceiling:
    rows: int  # token rows of one micro-batch
    step_flops: float  # per micro-batch, as MFU counts them (core.device.training_flops_per_token)
    gemm_flops: float  # per micro-batch, forward + backward
    attention_flops: float  # per micro-batch, causal: half of the full scores, as MFU counts them
    gemm_seconds: float  # median
    attention_seconds: float  # median
    peak_flops: float

    def mfu_gemm_only(self) -> float:
        """MFU of a step that took exactly its GEMMs' time (attention and everything else free)."""
        return self.step_flops / self.gemm_seconds / self.peak_flops

    def mfu_gemm_attention(self) -> float:
        """MFU of a step that took its GEMMs' and its attention's time, and nothing more."""
        return self.step_flops / (self.gemm_seconds + self.attention_seconds) / self.peak_flops


def linear_shapes(cfg) -> list[tuple[int, int]]:
    """(in, out) of every matmul weight of the model, in call order: per layer q, k, v, o, gate, up,
    down; then the output head."""
    h, i, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_kv_heads * cfg.head_dim
    q = cfg.num_heads * cfg.head_dim
    layer = [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]
    return layer * cfg.num_layers + [(h, cfg.vocab_size)]


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: first-call allocations and oneDNN primitive creation
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_ceiling(cfg, micro_batch: int, seq_len: int, precision: str, peak_flops: float,
                    repeats: int = 5, device: str = "cpu") -> Ceiling:
    import torch
    import torch.nn.functional as F

    from core.device import training_flops_per_token
    from core.model import attention_in_fp32

    dtype = getattr(torch, DTYPES[precision])
    dev = torch.device(device)
    # Attention in the dtype the model computes it in: fp32 on a CPU under bf16 autocast too.
    with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
        attention_dtype = torch.float32 if attention_in_fp32(torch.empty(0, device=dev)) else dtype
    rows = micro_batch * seq_len
    shapes = linear_shapes(cfg)
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int, of: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dev, of)

    xs = [rand(rows, i).requires_grad_() for i, _ in shapes]
    ws = [rand(o, i).requires_grad_() for i, o in shapes]
    gs = [rand(rows, o) for _, o in shapes]

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)  # CPU–GPU sync: the timing must include the queued kernels

    def gemms() -> None:
        for x, w, g in zip(xs, ws, gs, strict=True):
            F.linear(x, w).backward(g)
            x.grad = w.grad = None
        sync()

    B, N, K, T, D = micro_batch, cfg.num_heads, cfg.num_kv_heads, seq_len, cfg.head_dim
    q, k, v = (rand(B, H, T, D, of=attention_dtype).requires_grad_() for H in (N, K, K))
    gy = rand(B, N, T, D, of=attention_dtype)

    def attention() -> None:
        for _ in range(cfg.num_layers):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=N != K).backward(gy)
            q.grad = k.grad = v.grad = None
        sync()

    return Ceiling(rows=rows, step_flops=training_flops_per_token(cfg, seq_len) * rows,
                   gemm_flops=float(sum(6 * rows * i * o for i, o in shapes)),
                   attention_flops=float(6 * cfg.num_layers * cfg.hidden_size * seq_len * rows),
                   gemm_seconds=_median_seconds(gemms, repeats),
                   attention_seconds=_median_seconds(attention, repeats), peak_flops=peak_flops)


def main(argv: list[str] | None = None) -> int:
    from core.config import PRESETS

    p = module_parser("mfu_ceiling", __doc__)
    p.add_argument("--preset", default="small", choices=list(PRESETS))
    p.add_argument("--precision", default="bf16", choices=list(DTYPES))
    p.add_argument("--micro-batch", type=int_at_least(1), help="default: the preset's")
    p.add_argument("--repeats", type=int_at_least(1), default=5)
    p.add_argument("--threads", type=int_at_least(0), default=0, help="torch threads (0: torch's default)")
    p.add_argument("--tokens-per-s", type=positive_number,
                   help="a measured run's tokens/s, to place it against the ceiling")
    args = p.parse_args(argv)

    import torch

    from bench.runners import model_config_for
    from core.config import config_from_preset, preset
    from core.data import prepare_data
    from core.precision import matmul_peak

    if args.threads:
        torch.set_num_threads(args.threads)
    pre = preset(args.preset)
    micro = args.micro_batch or pre.micro_batch
    peak = matmul_peak(torch.device("cpu"), args.precision)
    # The vocabulary a run of the preset trains with (its tokenizer's: the builtin corpus gives base 9,194
    # tokens, not 50,000), as the run's MFU counts it.
    cfg = config_from_preset(args.preset)
    model = model_config_for(cfg, prepare_data(cfg.data))
    c = measure_ceiling(model, micro, pre.seq_len, args.precision, peak, args.repeats)
    ms = 1e3
    print(f"{args.preset}, {args.precision}, micro-batch {micro} × {pre.seq_len} tokens, "
          f"{torch.get_num_threads()} threads; matmul peak {peak / 1e9:,.0f} GFLOP/s")
    print(f"  GEMMs:     {c.gemm_seconds * ms:8.1f} ms  {c.gemm_flops / c.gemm_seconds / 1e9:7,.0f} GFLOP/s "
          f"({c.gemm_flops / c.gemm_seconds / peak:.0%} of peak)")
    print(f"  attention: {c.attention_seconds * ms:8.1f} ms  "
          f"{c.attention_flops / c.attention_seconds / 1e9:7,.0f} GFLOP/s (causal FLOPs, as MFU counts them)")
    print(f"  MFU ceiling: {c.mfu_gemm_only():.0%} if the step were its GEMMs alone, "
          f"{c.mfu_gemm_attention():.0%} with its attention")
    if args.tokens_per_s:
        step = c.rows / args.tokens_per_s
        print(f"  a run at {args.tokens_per_s:,.0f} tokens/s: {step * ms:.1f} ms per micro-batch, MFU "
              f"{c.step_flops / step / peak:.0%}; GEMMs + attention are "
              f"{(c.gemm_seconds + c.attention_seconds) / step:.0%} of its time")
    return 0


if __name__ == "__main__":
    sys.exit(run_module(main, "mfu_ceiling"))
