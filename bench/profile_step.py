"""Where one optimizer step's time goes: torch.profiler over a few steps of the bare loop.

``python -m bench.profile_step --preset small --precision bf16 --compile default``
prints the step's regions (forward, loss, backward, optimizer) by wall time,
the share of matrix multiplications against everything else (the part
torch.compile can shorten), the top operators by self time, and with
``--explain`` the graph breaks ``torch._dynamo`` reports. This is how the gaps
in docs/benchmarks.md were found. ``--loss separate`` computes the loss after
the model instead of inside it (how the Trainer did before the loss joined the
compiled graph).
"""

from __future__ import annotations

import contextlib
import sys
import time

from bench.module_cli import int_at_least, module_parser, run_module
from core.config import PRESETS

# Operators whose self time is matrix multiplication (or attention, itself two matmuls).
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm",
              "mkldnn", "aten::_scaled_dot_product", "aten::_flash_attention")
REGIONS = ("forward", "loss", "backward", "optimizer")


def main(argv: list[str] | None = None) -> int:
    p = module_parser("profile_step", __doc__)
    p.add_argument("--preset", default="small", choices=list(PRESETS))
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--compile", default="off", help="off, default, … (torch.compile mode)")
    p.add_argument("--scope", default="model", choices=["model", "block"])
    p.add_argument("--loss", default="model", choices=["model", "separate"],
                   help="model: the model returns the loss (the Trainer's way; in the graph when compiled "
                        "whole-model); separate: logits out of the model, loss computed after it")
    p.add_argument("--micro-batch", type=int_at_least(1), default=8)
    p.add_argument("--steps", type=int_at_least(1), default=2, help="profiled steps after 3 warm-up steps")
    p.add_argument("--explain", action="store_true", help="also run torch._dynamo.explain on the forward")
    p.add_argument("--rows", type=int_at_least(1), default=25)
    p.add_argument("--threads", type=int_at_least(0), default=0,
                   help="torch threads (0: torch's default); 1 reads cleaner on a shared machine")
    p.add_argument("--shapes", action="store_true", help="also list the top operators by input shapes and dtypes")
    args = p.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from bench.bare_loop import compile_forward
    from bench.runners import preset_model
    from core.loss import token_loss_sum

    # Inductor's own C++ kernels show up in the profile by name (otherwise their time is
    # booked to the graph as a whole and the matmul share reads too high).
    torch._inductor.config.cpp.enable_kernel_profile = True
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg, data, model = preset_model(args.preset)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    batch = data.train.batch(list(range(args.micro_batch)))
    amp = (torch.autocast("cpu", dtype=torch.bfloat16) if args.precision == "bf16"
           else contextlib.nullcontext())

    forward = compile_forward(model, args.compile, args.scope)

    def compiled_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with record_function("forward"), amp:
            if args.loss == "model":
                return forward(x, targets=y) / y.numel()
            logits = forward(x)
            with record_function("loss"):
                return token_loss_sum(logits, y) / y.numel()

    def step() -> None:
        loss = compiled_loss(batch.inputs, batch.targets)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    if args.explain:
        explanation = torch._dynamo.explain(model)(batch.inputs)
        print(f"dynamo: {explanation.graph_count} graph(s), {explanation.graph_break_count} graph break(s)")
        for reason in explanation.break_reasons:
            print("  break:", reason.reason)
    t0 = time.perf_counter()
    for _ in range(3):
        step()
    print(f"warm-up (3 steps, compile included): {time.perf_counter() - t0:.1f} s")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=args.shapes) as prof:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    tokens = args.steps * args.micro_batch * cfg.data.seq_len
    print(f"{args.preset}, {args.precision}, compile {args.compile} ({args.scope}), loss {args.loss}, "
          f"{torch.get_num_threads()} thread(s)")
    print(f"{args.steps} steps: {wall:.2f} s wall, {tokens / wall:,.0f} tokens/s (under the profiler)")
    # Regions by their own total (wall) time; "loss" nests inside "forward".
    by_key = {e.key: e for e in events}
    for name in REGIONS:
        if name in by_key:
            print(f"  region {name:<10} {by_key[name].cpu_time_total / 1e3 / args.steps:8.1f} ms/step "
                  f"({by_key[name].cpu_time_total / 1e6 / wall:.0%} of wall)")
    # Self time: each microsecond counted once, in the operator that spent it (regions excluded).
    ops = [e for e in events if e.key not in REGIONS]
    total = sum(e.self_cpu_time_total for e in ops)
    matmul = sum(e.self_cpu_time_total for e in ops if any(e.key.startswith(m) for m in MATMUL_OPS))
    print(f"matrix multiplications (and attention): {matmul / total:.1%} of operator self time; "
          f"everything else {1 - matmul / total:.1%} -> removing all of it would give at most "
          f"{total / matmul:.2f}x")
    print(f"{'operator':<60} {'self ms/step':>12} {'share':>7} {'calls/step':>10}")
    for e in sorted(ops, key=lambda e: e.self_cpu_time_total, reverse=True)[:args.rows]:
        print(f"{e.key[:60]:<60} {e.self_cpu_time_total / 1e3 / args.steps:12.1f} "
              f"{e.self_cpu_time_total / total:7.1%} {e.count / args.steps:10.0f}")
    if args.shapes:
        by_shape = [e for e in prof.key_averages(group_by_input_shape=True) if e.key not in REGIONS]
        print(f"{'operator, input shapes':<100} {'self ms/step':>12} {'calls/step':>10}")
        for e in sorted(by_shape, key=lambda e: e.self_cpu_time_total, reverse=True)[:args.rows]:
            shapes = ", ".join(str(tuple(s)) for s in e.input_shapes if s)
            print(f"{(e.key + ' ' + shapes)[:100]:<100} {e.self_cpu_time_total / 1e3 / args.steps:12.1f} "
                  f"{e.count / args.steps:10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(run_module(main, "profile_step"))
