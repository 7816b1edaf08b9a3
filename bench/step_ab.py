"""Where the loss is computed, per precision: interleaved step times in one process.

``python -m bench.step_ab --threads 1 --repeats 6`` trains the small preset's
model (micro-batch 8) step by step in up to six cells, one step of each in turn,
so a shared machine's load falls on all of them alike:

- ``fp32-off``, ``bf16-off``: eager (the loss computed as in the Trainer);
- ``*-sep``: whole-model torch.compile, the loss computed after the compiled
  graph from its logits (the Trainer's arrangement before core.loss);
- ``*-graph``: whole-model torch.compile with the loss inside the graph
  (``forward(..., targets=…)``, the Trainer's arrangement now);
- ``bf16-*-attn16``: bf16 with attention in bf16 as autocast would run it,
  where the model runs it in fp32 on a CPU (``core.model.attention_in_fp32``;
  a compiled cell compiles a graph of its own):

      python -m bench.step_ab --preset tiny --micro-batch 16 --cells bf16-off,bf16-off-attn16,fp32-off

It prints each cell's fastest and median step, the ratio to the first cell,
and MFU against a 2048² GEMM in fp32 and in bf16 timed between the steps.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time

from bench.autocast_attention import attention_as_autocast
from bench.module_cli import int_at_least, module_parser, run_module
from core.config import PRESETS

CELLS = "fp32-off,fp32-sep,fp32-graph,bf16-off,bf16-sep,bf16-graph"
KNOWN_CELLS = (*CELLS.split(","), "bf16-off-attn16", "bf16-sep-attn16", "bf16-graph-attn16")


def main(argv: list[str] | None = None) -> int:
    p = module_parser("step_ab", __doc__)
    p.add_argument("--preset", default="small", choices=list(PRESETS))
    p.add_argument("--micro-batch", type=int_at_least(1), default=8)
    p.add_argument("--threads", type=int_at_least(0), default=0, help="torch threads (0: torch's default)")
    p.add_argument("--repeats", type=int_at_least(1), default=6)
    p.add_argument("--cells", default=CELLS)
    args = p.parse_args(argv)
    for cell in args.cells.split(","):
        if cell not in KNOWN_CELLS:
            p.error(f"unknown cell {cell!r}: one of {', '.join(KNOWN_CELLS)}")

    import torch

    from bench.runners import preset_model
    from core.device import training_flops_per_token
    from core.loss import token_loss_sum

    if args.threads:
        torch.set_num_threads(args.threads)
    cells = args.cells.split(",")
    cfg, data, model = preset_model(args.preset)
    flops = training_flops_per_token(model.config, cfg.data.seq_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)  # tiny lr: every cell sees ~the same weights
    batch = data.train.batch(list(range(args.micro_batch)))
    x, y = batch.inputs, batch.targets
    tokens = y.numel()
    compiled = torch.compile(model)

    def step(cell: str) -> None:
        precision, kind, *attn16 = cell.split("-")
        amp = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext())
        with amp, attention_as_autocast(bool(attn16)):
            if kind == "off":
                loss = model(x, targets=y)
            elif kind == "sep":
                loss = token_loss_sum(compiled(x), y)
            else:
                loss = compiled(x, targets=y)
        (loss / tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    gemms = {name: (torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype))
             for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    for cell in cells:
        t0 = time.perf_counter()
        step(cell)
        step(cell)
        print(f"{cell}: warm-up {time.perf_counter() - t0:.1f} s", flush=True)
    times: dict[str, list[float]] = {c: [] for c in cells}
    gemm_times: dict[str, list[float]] = {k: [] for k in gemms}
    for r in range(args.repeats):
        for cell in cells:
            t0 = time.perf_counter()
            step(cell)
            times[cell].append(time.perf_counter() - t0)
        for name, (a, b) in gemms.items():
            a @ b
            t0 = time.perf_counter()
            a @ b
            gemm_times[name].append(time.perf_counter() - t0)
        print(f"repeat {r + 1}/{args.repeats}, load {open('/proc/loadavg').read().split()[0]}", flush=True)
    peak = {name: 2 * 2048**3 / min(ts) for name, ts in gemm_times.items()}
    print(f"{torch.get_num_threads()} thread(s); 2048² GEMM: fp32 {peak['fp32'] / 1e9:.0f} GFLOP/s, "
          f"bf16 {peak['bf16'] / 1e9:.0f} GFLOP/s ({peak['bf16'] / peak['fp32']:.1f}x)")
    first = cells[0]
    print(f"{'cell':<12} {'min ms':>9} {'median ms':>10} {'tok/s':>7} {'x ' + first + ' (min/median)':>24} "
          f"{'MFU own peak':>12} {'MFU bf16 peak':>13}")
    for cell in cells:
        best, mid = min(times[cell]), statistics.median(times[cell])
        tps = tokens / best
        print(f"{cell:<12} {best * 1e3:9.1f} {mid * 1e3:10.1f} {tps:7.0f} "
              f"{min(times[first]) / best:11.2f} / {statistics.median(times[first]) / mid:.2f} "
              f"{tps * flops / peak[cell.split('-')[0]]:12.0%} {tps * flops / peak['bf16']:13.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(run_module(main, "step_ab"))
