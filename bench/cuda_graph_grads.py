"""Do CUDA-graph compile modes give the right gradients with gradient accumulation?

Speedboard refuses ``reduce-overhead`` and ``max-autotune`` with accumulation > 1
(core/config.py): CUDA-graph replay reuses static buffers, and some PyTorch
releases have produced silently wrong accumulated gradients. This check trains
nothing: it compares, window after window, the gradients that a compiled copy
accumulates over ``accum`` micro-batches with those of the eager model on the
same weights and batches. Meaningful on a GPU only (on a CPU, Inductor skips
CUDA graphs and the check merely exercises the compiler).

``python -m bench.cuda_graph_grads --device cuda`` prints one line per mode and
exits 1 when a mode disagrees.
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.nn.functional as F

from bench.module_cli import int_at_least, module_parser, run_module
from core.compile import reset_compiler
from core.config import CUDA_GRAPH_MODES, PRESETS, ModelConfig, preset
from core.device import DTYPES, resolve_device
from core.model import LlamaForCausalLM


def accumulated_grads(forward, model: torch.nn.Module, batches: list[torch.Tensor], device: torch.device,
                      precision: str) -> list[torch.Tensor]:
    """Gradients of the window's mean loss, accumulated over the micro-batches as the bare loop does."""
    model.zero_grad(set_to_none=True)
    for tokens in batches:
        with torch.autocast(device.type, dtype=DTYPES[precision], enabled=precision != "fp32"):
            logits = forward(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
        (loss / len(batches)).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def gradient_check(cfg: ModelConfig, mode: str, accum: int, micro_batch: int, seq_len: int, device: torch.device,
                   precision: str = "fp32", windows: int = 3, seed: int = 0) -> dict:
    """Largest gradient difference between a ``mode``-compiled copy and eager, relative to the gradient's size."""
    torch.manual_seed(seed)
    eager = LlamaForCausalLM(cfg).to(device)
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin, mode=None if mode == "default" else mode)
    worst = 0.0
    for _ in range(windows):  # later windows replay captured graphs: where stale buffers would show
        batches = [torch.randint(0, cfg.vocab_size, (micro_batch, seq_len + 1), device=device) for _ in range(accum)]
        want = accumulated_grads(eager, eager, batches, device, precision)
        got = accumulated_grads(compiled, twin, batches, device, precision)
        for w, g in zip(want, got, strict=True):
            worst = max(worst, ((g - w).abs().max() / w.abs().max().clamp_min(1e-12)).item())
    tolerance = 1e-3 if precision == "fp32" else 5e-2
    return {"mode": mode, "accum": accum, "max_relative_difference": worst, "tolerance": tolerance,
            "ok": worst <= tolerance, "cuda_graphs": device.type == "cuda"}


def main(argv: list[str] | None = None) -> int:
    p = module_parser("cuda_graph_grads", __doc__)
    p.add_argument("--preset", default="tiny", choices=list(PRESETS))
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--accum", type=int_at_least(1), default=4)
    p.add_argument("--micro-batch", type=int_at_least(1), default=2)
    p.add_argument("--modes", default=",".join(CUDA_GRAPH_MODES))
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    chosen = preset(args.preset)
    failed = False
    for mode in args.modes.split(","):
        r = gradient_check(chosen.model, mode, args.accum, args.micro_batch, chosen.seq_len, device, args.precision)
        failed |= not r["ok"]
        print(f"{mode:<16} accum {r['accum']}: max relative gradient difference {r['max_relative_difference']:.2e} "
              f"(tolerance {r['tolerance']:g}) {'ok' if r['ok'] else 'WRONG'}"
              + ("" if r["cuda_graphs"] else "  [no CUDA: graphs not used]"))
        reset_compiler()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_module(main, "cuda_graph_grads"))
