"""Where one optimizer step's time goes: torch.profiler over a few steps of the bare loop.

``python -m bench.profile_step --preset small --compile default`` prints the
share of matrix multiplications against everything else (the part torch.compile
can shorten), the top operators, and the graph breaks and recompilations that
``torch._dynamo`` reports. This is how the gaps in docs/benchmarks.md were found.
"""

from __future__ import annotations

import argparse
import sys
import time

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm",
              "mkldnn", "aten::_scaled_dot_product")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile_step")
    p.add_argument("--preset", default="small")
    p.add_argument("--compile", default="off", help="off, default, … (torch.compile mode)")
    p.add_argument("--scope", default="model", choices=["model", "block"])
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=2, help="profiled steps after 3 warm-up steps")
    p.add_argument("--loss-in-graph", action="store_true",
                   help="compile the loss together with the model (whole-model scope): one graph from ids to loss")
    p.add_argument("--explain", action="store_true", help="also run torch._dynamo.explain on the forward")
    p.add_argument("--rows", type=int, default=25)
    args = p.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    from bench.bare_loop import compile_forward
    from bench.runners import preset_model

    cfg, data, model = preset_model(args.preset)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    batch = data.train.batch(list(range(args.micro_batch)))

    def model_loss(forward, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = forward(inputs)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))

    if args.loss_in_graph and args.compile != "off":
        kwargs = {} if args.compile == "default" else {"mode": args.compile}
        compiled_loss = torch.compile(lambda x, y: model_loss(model, x, y), **kwargs)
    else:
        forward = compile_forward(model, args.compile, args.scope)

        def compiled_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return model_loss(forward, x, y)

    def step() -> None:
        compiled_loss(batch.inputs, batch.targets).backward()
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
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    # Self time: each microsecond counted once, in the operator that spent it.
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if any(e.key.startswith(m) for m in MATMUL_OPS))
    tokens = args.steps * args.micro_batch * cfg.data.seq_len
    print(f"{args.steps} steps: {wall:.2f} s wall, {tokens / wall:,.0f} tokens/s (under the profiler)")
    print(f"matrix multiplications (and attention): {matmul / total:.1%} of operator self time; "
          f"everything else {1 - matmul / total:.1%} -> removing all of it would give at most "
          f"{total / matmul:.2f}x")
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
