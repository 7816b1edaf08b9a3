"""``auto`` precision decided by a measured probe, and the cached, precision-aware matmul peak."""

from __future__ import annotations

import json

import pytest
import torch

from core import precision as prec
from core.config import ModelConfig, preset
from core.device import measure_matmul_peak, resolve_precision
from core.errors import ConfigError
from core.event_text import event_line
from core.events import RunStarted
from core.precision import ProbeResult, cached_choice, decide_precision, matmul_peak

CPU = torch.device("cpu")
AMX_LIKE = ProbeResult(fp32_flops=192e9, bf16_flops=1074e9)  # 5.6×, as measured on an AMX Xeon
NO_FAST_BF16 = ProbeResult(fp32_flops=150e9, bf16_flops=150e9)  # 1.0×
TINY = ModelConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32,
                   max_position_embeddings=16)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(prec, "_PROBED_HERE", set())
    monkeypatch.setattr(prec, "_PEAK_MEASURED_HERE", set(), raising=False)


def new_process() -> None:
    """What a later run, in its own process, starts with: nothing measured yet."""
    prec._PROBED_HERE.clear()
    prec._PEAK_MEASURED_HERE.clear()


def never() -> ProbeResult:
    raise AssertionError("the probe must not run here")


# ---------------------------------------------------------------------- the decision
def test_a_cpu_with_fast_bf16_matmuls_gets_bf16_and_says_why():
    choice = decide_precision("auto", CPU, AMX_LIKE)
    assert choice.precision == "bf16" and choice.requested == "auto"
    assert choice.reason == "bf16: training 5.6× faster than fp32 on this CPU"
    assert choice.bf16_speedup == pytest.approx(1074 / 192)


def test_a_cpu_without_fast_bf16_stays_fp32():
    choice = decide_precision("auto", CPU, lambda: NO_FAST_BF16)
    assert choice.precision == "fp32" and "1.00×" in choice.reason
    # The threshold: 1.5× is enough, just under it is not.
    assert decide_precision("auto", CPU, ProbeResult(100.0, 130.0)).precision == "bf16"
    assert decide_precision("auto", CPU, ProbeResult(100.0, 129.0)).precision == "fp32"


def test_the_reason_never_says_only_the_threshold():
    """1.2996 was shown as "only 1.30× … (auto takes bf16 from 1.3×)": below the threshold, rounded down."""
    for bf16, precision in ((129.94, "fp32"), (129.996, "fp32"), (130.0, "bf16")):
        choice = decide_precision("auto", CPU, ProbeResult(100.0, bf16))
        assert choice.precision == precision, bf16
        assert "1.30×" not in choice.reason and choice.bf16_speedup == pytest.approx(bf16 / 100)
    assert "only 1.29×" in decide_precision("auto", CPU, ProbeResult(100.0, 129.996)).reason


def test_a_resume_keeps_its_parents_precision_where_the_device_has_it():
    from core.precision import cached_choice, lineage_choice

    kept = lineage_choice("bf16", "cpu", CPU)
    assert kept.precision == "bf16" and kept.reason == "bf16: as its parent trained (auto is decided once per lineage)"
    assert lineage_choice("bf16", "cuda", CPU) is None  # another kind of device: decided anew
    assert lineage_choice(None, "cpu", CPU) is None and lineage_choice("fp8", "cpu", CPU) is None
    # What the dashboard shows and fits memory to, without measuring: the parent's, not the cached probe's
    assert cached_choice("auto", CPU, preset("tiny").model, lineage=("bf16", "cpu")) == kept
    assert cached_choice("fp32", CPU, preset("tiny").model, lineage=("bf16", "cpu")).precision == "fp32"


@pytest.mark.parametrize("explicit", ["fp32", "bf16"])
def test_an_explicit_precision_is_used_without_probing(explicit):
    choice = decide_precision(explicit, CPU, never)
    assert choice.precision == explicit and choice.reason == f"{explicit}: as set"


def test_cuda_auto_is_bf16_where_supported_without_probing(monkeypatch):
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr("core.device.bf16_supported", lambda device: True)
    assert decide_precision("auto", cuda, never).precision == "bf16"
    monkeypatch.setattr("core.device.bf16_supported", lambda device: False)
    assert decide_precision("auto", cuda, never).precision == "fp32"


def test_bf16_where_unsupported_is_a_config_error(monkeypatch):
    monkeypatch.setattr("core.device.bf16_supported", lambda device: False)
    with pytest.raises(ConfigError, match="bf16 is not supported") as info:
        decide_precision("bf16", CPU, never)
    assert info.value.field == "precision"
    with pytest.raises(ConfigError):
        resolve_precision("bf16", CPU)


def test_resolve_precision_keeps_its_signature_and_probes_the_models_shapes(monkeypatch):
    seen = []

    def fake_probe(model, device=None, **kw):
        seen.append(prec.probe_shapes(model))
        return AMX_LIKE

    monkeypatch.setattr(prec, "probe_bf16_speedup", fake_probe)
    assert resolve_precision("auto", CPU, TINY) == "bf16"
    assert seen == [((2048, 16, 32), (2048, 32, 16), (2048, 16, 64))]
    assert resolve_precision("auto", CPU) == "bf16" and len(seen) == 2  # small's shapes by default
    assert seen[1] == prec.probe_shapes(preset("small").model)


def test_the_probe_is_cached_per_machine(monkeypatch):
    calls = []
    monkeypatch.setattr(prec, "probe_bf16_speedup", lambda model, device=None: calls.append(1) or AMX_LIKE)
    assert cached_choice("auto", CPU, TINY) is None  # nothing measured yet: the GUI says "decided at start"
    decide_precision("auto", CPU, model=TINY)
    assert cached_choice("auto", CPU, TINY).reason == "bf16: training 5.6× faster than fp32 on this CPU"
    decide_precision("auto", CPU, model=TINY)
    assert len(calls) == 1  # one measurement per process
    for _ in range(prec.PROBE_MEASUREMENTS + 2):
        new_process()
        decide_precision("auto", CPU, model=TINY)
    assert len(calls) == prec.PROBE_MEASUREMENTS  # the first runs measure, later ones read
    # Another CPU (other flags) or another torch measures again.
    monkeypatch.setattr(prec, "_cpu_identity", lambda: {"cpu": "AMD EPYC", "flags": "avx2 fma"})
    assert cached_choice("auto", CPU, TINY) is None
    decide_precision("auto", CPU, model=TINY)
    assert len(calls) == prec.PROBE_MEASUREMENTS + 1


def test_a_probe_taken_on_a_busy_machine_does_not_decide_for_good(monkeypatch):
    busy = ProbeResult(fp32_flops=100e9, bf16_flops=55e9)  # casts starved: 0.55×
    quiet = ProbeResult(fp32_flops=127e9, bf16_flops=554e9)  # 4.4×, as measured on the idle AMX Xeon
    probes = iter([busy, quiet, busy, busy])
    monkeypatch.setattr(prec, "probe_bf16_speedup", lambda model, device=None: next(probes))
    assert decide_precision("auto", CPU, model=TINY).precision == "fp32"
    new_process()
    second = decide_precision("auto", CPU, model=TINY)
    assert second.precision == "bf16" and second.bf16_speedup == pytest.approx(554 / 127)
    new_process()
    assert decide_precision("auto", CPU, model=TINY).precision == "bf16"  # each precision's best is kept
    new_process()
    assert decide_precision("auto", CPU, model=TINY).precision == "bf16"  # read: no fourth measurement
    assert next(probes) is busy


def test_a_damaged_cache_entry_is_measured_again(monkeypatch):
    monkeypatch.setattr(prec, "probe_bf16_speedup", lambda model, device=None: NO_FAST_BF16)
    decide_precision("auto", CPU, model=TINY)
    prec._probe_path(TINY, CPU).write_text("{not json")
    assert prec.cached_probe(TINY, CPU) is None
    assert decide_precision("auto", CPU, model=TINY).precision == "fp32"


@pytest.mark.parametrize("damage", [{"measurements": "three"}, {"measurements": None}, {"measurements": 0},
                                    {"fp32_flops": 0}, {"bf16_flops": float("nan")}, {"fp32_flops": "fast"},
                                    {"bf16_flops": True}, {"fp32_flops": 1e-300}, {"bf16_flops": 1e30},
                                    {"fp32_flops": 2e8, "bf16_flops": 9e10}])
def test_a_cache_entry_with_a_damaged_value_is_measured_again(damage, monkeypatch):
    """Values that do not make sense (a count that is not a count, a throughput of 0, NaN or far outside what
    a processor reaches, a bf16 speedup of 450×) are a damaged entry: measured again, never trusted (no "bf16
    trains only 0.00×", no "training inf× faster") and never a traceback."""
    calls = []
    monkeypatch.setattr(prec, "probe_bf16_speedup", lambda model, device=None: calls.append(1) or AMX_LIKE)
    decide_precision("auto", CPU, model=TINY)
    path = prec._probe_path(TINY, CPU)
    path.write_text(json.dumps({**json.loads(path.read_text()), **damage}))
    assert prec.cached_probe(TINY, CPU) is None
    new_process()
    assert decide_precision("auto", CPU, model=TINY).precision == "bf16" and len(calls) == 2
    # The peak's cache likewise.
    measure_matmul_peak("cpu", "fp32")
    peak = prec._peak_path(CPU, "fp32")
    for flops in (0, -1.0, float("inf"), "many", 1e-300, 1e30):
        peak.write_text(json.dumps({"flops": flops, "measurements": 5}))
        assert prec.cached_peak(CPU, "fp32") is None
        assert matmul_peak(CPU, "fp32", measure=lambda: 123e9) == 123e9


def test_a_cache_file_that_is_not_a_regular_file_is_not_read(monkeypatch):
    """A named pipe where the probe's cache file should be: reading it would block the run for good."""
    import os

    monkeypatch.setattr(prec, "probe_bf16_speedup", lambda model, device=None: AMX_LIKE)
    path = prec._probe_path(TINY, CPU)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    assert prec.cached_probe(TINY, CPU) is None  # returns at once
    assert prec._read_cache(path) is None


def test_a_cache_entry_that_cannot_be_replaced_leaves_no_temporary_file(monkeypatch):
    """A folder in a peak's place: the run measures again, and left one more temporary file at each start."""
    path = prec._peak_path(CPU, "fp32")
    path.mkdir(parents=True)
    for flops in (100e9, 120e9):
        assert matmul_peak(CPU, "fp32", measure=lambda f=flops: f) == flops
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


@pytest.mark.parametrize("args, message", [(["--threads", "-1"], "--threads must be 1 or more, got -1"),
                                           (["--threads", "0"], "--threads must be 1 or more, got 0"),
                                           (["--device", "nope"], "unknown device 'nope'")])
def test_the_measuring_command_says_a_bad_setting_in_one_line(args, message, capsys):
    assert prec.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m core.precision: error: ") and message in err and len(err.splitlines()) == 1


def test_the_real_probe_times_a_training_pass_in_both_precisions_in_turn(monkeypatch):
    seen, order = [], []
    real = prec._training_passes

    def spy(model, device, rows, precisions):
        seen.append((model, rows, precisions))
        flops, passes = real(model, device, rows, precisions)

        def logged(dtype, one_pass):
            return lambda: order.append(dtype) or one_pass()

        return flops, [logged(dtype, one_pass) for dtype, one_pass in zip(precisions, passes, strict=True)]

    monkeypatch.setattr(prec, "_training_passes", spy)
    before = torch.random.get_rng_state()
    result = prec.probe_bf16_speedup(TINY, CPU, rows=8, seconds=0.0)
    assert torch.equal(torch.random.get_rng_state(), before)  # a probing run starts from the same weights
    assert result.shapes == ((8, 16, 32), (8, 32, 16), (8, 16, 64))
    assert result.fp32_flops > 0 and result.bf16_flops > 0 and result.speedup > 0
    # bf16 as training runs it: fp32 weights under bf16 autocast, casts included.
    assert seen == [(TINY, 8, (None, torch.bfloat16))]
    # A warm-up of each, then the two in turn, so a load that comes and goes hits both alike.
    assert order == [None, torch.bfloat16, None, torch.bfloat16]


def test_interleaved_timing_keeps_each_pass_best_and_runs_them_in_turn():
    order = []
    times = {"a": iter([9.0, 3.0, 2.0, 4.0, 1.0]), "b": iter([9.0, 5.0, 6.0, 0.5, 7.0])}

    def timed(name):
        return lambda: order.append(name) or next(times[name])

    best = prec.best_interleaved((timed("a"), timed("b")), seconds=0.0, min_runs=4)
    assert order == ["a", "b"] * 5  # one warm-up each (not counted), then four rounds
    assert best == [1.0, 0.5]


def test_the_probe_pass_is_a_layers_forward_and_backward_with_the_head_and_loss(monkeypatch):
    """What is timed: one decoder layer at the model's widths, the output head and the loss, with gradients."""
    from core import model as model_module

    built = []
    real_init = model_module.LlamaForCausalLM.__init__

    def spy_init(self, cfg):
        built.append(cfg)
        real_init(self, cfg)

    monkeypatch.setattr(model_module.LlamaForCausalLM, "__init__", spy_init)
    flops, (fp32_pass,) = prec._training_passes(TINY, CPU, rows=8, precisions=(None,))
    assert flops > 0 and fp32_pass() > 0
    (cfg,) = built
    assert cfg.num_layers == 1 and cfg.hidden_size == TINY.hidden_size and cfg.vocab_size == TINY.vocab_size
    assert cfg.num_heads == TINY.num_heads and cfg.num_kv_heads == TINY.num_kv_heads


# ---------------------------------------------------------------------- the matmul peak
def test_the_peak_is_measured_in_the_runs_precision(monkeypatch):
    dtypes = []
    real = prec._time_gemms

    def spy(shapes, dtype, device, seconds, min_runs=1):
        dtypes.append((dtype, shapes[0], min_runs))
        return real(shapes, dtype, device, 0.0, min_runs)

    monkeypatch.setattr(prec, "_time_gemms", spy)
    assert prec.measure_gemm_peak(CPU, "bf16", sizes=(16, 32), seconds=0.0) > 0
    # Each size at least twice after its warm-up, in bf16.
    assert dtypes == [(torch.bfloat16, (16, 16, 16), 2), (torch.bfloat16, (32, 32, 32), 2)]
    dtypes.clear()
    prec.measure_gemm_peak(CPU, "fp32", sizes=(16,), seconds=0.0)
    assert [d for d, _, _ in dtypes] == [torch.float32]


def test_the_peak_is_cached_per_precision_and_keeps_the_highest(monkeypatch):
    figures = iter([100e9, 300e9, 200e9, 50e9])
    calls = []

    def fake(device, precision, sizes=None, seconds=0.0):
        calls.append(precision)
        return next(figures)

    monkeypatch.setattr(prec, "measure_gemm_peak", fake)
    # The first runs on a machine each measure (a busy moment is outgrown by a quieter one) …
    assert [measure_matmul_peak("cpu", "fp32") for _ in range(prec.PEAK_MEASUREMENTS)] == [100e9, 300e9, 300e9]
    # … then the kept figure is read.
    assert measure_matmul_peak("cpu", "fp32") == 300e9
    assert calls == ["fp32"] * 3
    # bf16 has its own figure; a refresh that measures less keeps the higher one.
    assert measure_matmul_peak("cpu", "bf16") == 50e9
    assert matmul_peak(CPU, "bf16", refresh=True, measure=lambda: 40e9) == 50e9
    assert matmul_peak(CPU, "bf16", refresh=True, measure=lambda: 80e9) == 80e9
    assert prec.cached_peak(CPU, "fp32") == 300e9 and prec.cached_peak(CPU, "bf16") == 80e9
    saved = json.loads(prec._peak_path(CPU, "bf16").read_text())
    assert saved["precision"] == "bf16" and saved["threads"] == torch.get_num_threads()


def test_the_peak_depends_on_the_thread_count(monkeypatch):
    monkeypatch.setattr(prec, "measure_gemm_peak", lambda device, precision, sizes=None, seconds=0.0: 10e9)
    matmul_peak(CPU, "fp32")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if before > 1 else 2)
        assert prec.cached_peak(CPU, "fp32") is None
    finally:
        torch.set_num_threads(before)
    assert prec.cached_peak(CPU, "fp32") == 10e9


def test_a_peak_taken_on_a_busy_machine_is_raised_by_a_later_quieter_run(monkeypatch):
    """Three measurements taken while the machine was busy settle the peak low (85 GFLOP/s where 95 is
    reached when it is quiet): each later process adds one short measurement, so the figure rises and the
    MFU it divides stays below 100%."""
    figures = iter([85e9, 80e9, 84e9, 95e9, 70e9])
    calls = []

    def fake(device, precision, sizes=None, seconds=0.0):
        calls.append((sizes, seconds))
        return next(figures)

    monkeypatch.setattr(prec, "measure_gemm_peak", fake)
    for _ in range(prec.PEAK_MEASUREMENTS):
        new_process()
        assert matmul_peak(CPU, "fp32") == 85e9
    new_process()
    assert matmul_peak(CPU, "fp32") == 95e9  # a quieter run: raised
    assert calls[-1] == ((prec._PEAK_SIZES["cpu"][0],), prec._QUICK_PEAK_SECONDS)  # short: one size, briefly
    assert matmul_peak(CPU, "fp32") == 95e9 and len(calls) == 4  # once per process
    new_process()
    assert matmul_peak(CPU, "fp32") == 95e9  # a busy one: never lowered
    assert prec.cached_peak(CPU, "fp32") == 95e9 and len(calls) == 5


# ---------------------------------------------------------------------- what a run says
def _started(precision: str, requested: str, reason: str) -> RunStarted:
    return RunStarted("r", 0.0, run_dir="/runs/r", config={"train": {"precision": requested}}, device="cpu",
                      precision=precision, num_parameters=1_000_000, tokens_per_step=1024, budget_tokens=10_240,
                      total_steps=10, precision_reason=reason, matmul_peak_flops=1.074e12, flops_per_token=1e6)


def test_the_start_line_says_what_auto_chose_and_the_peak():
    line = event_line(_started("bf16", "auto", decide_precision("auto", CPU, AMX_LIKE).reason)).text
    assert "(bf16 — auto: training 5.6× faster than fp32 on this CPU; 1.00M parameters" in line
    assert "MFU of 1,074 GFLOP/s bf16 GEMMs" in line
    assert "auto" not in event_line(_started("fp32", "fp32", "fp32: as set")).text


def test_a_run_records_what_auto_chose(micro, monkeypatch):
    from core.events import ListSink
    from core.trainer import Trainer

    probed = []
    monkeypatch.setattr(prec, "probe_bf16_speedup", lambda model, device=None: probed.append(model) or AMX_LIKE)
    monkeypatch.setattr(prec, "measure_gemm_peak", lambda device, precision, sizes=None, seconds=0.0: 1e12)
    sink = ListSink()
    trainer = Trainer(micro(train={"precision": "auto", "budget": 1}), sink=sink)
    result = trainer.run()
    assert probed == [trainer.model_cfg]  # at the model it trains: the tokenizer's vocabulary, not the config's
    saved = json.loads((result.run_dir / "config.json").read_text())
    assert saved["precision"] == "bf16" and saved["config"]["train"]["precision"] == "auto"
    assert saved["precision_choice"] == {"requested": "auto", "precision": "bf16",
                                         "bf16_speedup": pytest.approx(1074 / 192),
                                         "reason": "bf16: training 5.6× faster than fp32 on this CPU"}
    started = next(e for e in sink.events if isinstance(e, RunStarted))
    assert started.precision == "bf16" and started.precision_reason.startswith("bf16: training 5.6×")
    assert started.matmul_peak_flops == 1e12 and started.flops_per_token > 0


@pytest.mark.parametrize(("fp16_flops", "warned"), [
    (30e9, "7.9× slower than fp32's 236"), (20e9, "12× slower than fp32's 236"),
    # 1.09× slower (a run 30% slower on the AMX Xeon): it was not said, the bar being 1.5×.
    (216e9, "1.1× slower than fp32's 236"), (230e9, None), (400e9, None)])
def test_fp16_on_a_cpu_that_emulates_it_is_said_with_its_figures(micro, monkeypatch, fp16_flops, warned):
    from core.events import ListSink, WarningRaised
    from core.trainer import Trainer

    peaks = {"fp16": fp16_flops, "fp32": 236e9}
    monkeypatch.setattr(prec, "measure_gemm_peak", lambda device, precision, sizes=None, seconds=0.0: peaks[precision])
    sink = ListSink()
    Trainer(micro(train={"precision": "fp16", "budget": 1}), sink=sink).run()
    notes = [w.message for w in sink.of(WarningRaised) if "fp16" in w.message]
    assert notes == ([f"fp16 matrix products run at {fp16_flops / 1e9:.0f} GFLOP/s on this CPU, {warned}: fp16 is "
                      "for GPUs; bf16 or fp32 train faster here"] if warned else [])


def test_fitting_a_split_for_the_window_thread_never_runs_the_probe(monkeypatch):
    from core.config import RunConfig
    from core.memory_budget import fit_run_config

    seen = []
    monkeypatch.setattr("core.memory_budget.fit_split",
                        lambda model, micro, accum, seq_len, precision, *rest: seen.append(precision))
    cfg = RunConfig().replace(model=TINY, data={"seq_len": 16}, train={"device": "cpu", "precision": "auto"})
    monkeypatch.setattr(prec, "probe_bf16_speedup", lambda model, device=None: never())
    fit_run_config(cfg)
    assert seen == ["fp32"]  # not decided yet: fp32's larger estimate
    monkeypatch.setattr(prec, "probe_bf16_speedup", lambda model, device=None: AMX_LIKE)
    decide_precision("auto", CPU, model=cfg.expected_model())  # a run decides it, at its model and vocabulary
    assert prec.cached_probe(cfg.expected_model(), CPU) is not None
    monkeypatch.setattr(prec, "probe_bf16_speedup", lambda model, device=None: never())
    fit_run_config(cfg)
    assert seen[-1] == "bf16"  # the cached decision


@pytest.mark.parametrize("text", ['{"flops": 1' + "0" * 400 + ', "measurements": 1}', "[" * 100_000 + "]" * 100_000,
                                  '{"flops": ' + "9" * 5000 + "}"])
def test_a_peak_cache_of_pathological_json_is_measured_again(text):
    measure_matmul_peak("cpu", "fp32")
    prec._peak_path(CPU, "fp32").write_text(text)
    assert prec.cached_peak(CPU, "fp32") is None
    assert matmul_peak(CPU, "fp32", measure=lambda: 77.0) == 77.0
