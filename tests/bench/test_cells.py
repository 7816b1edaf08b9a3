"""The benchmark matrix: which cells exist, how --cells selects them, the memory table's extra cells."""

from __future__ import annotations

import pytest

from bench.cells import DEFAULT_ACCUMS, BenchError, build_matrix, memory_cells, select_cells


def test_matrix_crosses_modes_and_accumulation_at_a_fixed_effective_batch():
    cells = build_matrix(8, DEFAULT_ACCUMS)
    assert [c.short_name for c in cells] == ["off-a1", "off-a4", "off-a8", "default-model-a1", "default-model-a4",
                                             "default-model-a8", "default-block-a1", "default-block-a4",
                                             "default-block-a8"]
    assert all(c.micro_batch * c.accum == 8 and c.name == f"{c.short_name}-fp32" for c in cells)
    assert [c.warmup_steps for c in cells[:4]] == [1, 1, 1, 3]


def test_precisions_cross_every_cell():
    cells = build_matrix(8, (1, 4), ("fp32", "bf16"))
    assert [c.name for c in cells] == [f"{base}-{p}" for p in ("fp32", "bf16") for base in
                                       ("off-a1", "off-a4", "default-model-a1", "default-model-a4",
                                        "default-block-a1", "default-block-a4")]


def test_cuda_adds_cuda_graph_modes_only_without_accumulation():
    extra = [c for c in build_matrix(8, DEFAULT_ACCUMS, ("bf16",), cuda=True)
             if c.mode in ("reduce-overhead", "max-autotune")]
    assert [c.name for c in extra] == ["reduce-overhead-model-a1-bf16", "max-autotune-model-a1-bf16"]


def test_effective_batch_must_divide_by_every_accumulation():
    with pytest.raises(BenchError, match="not divisible by accumulation 4"):
        build_matrix(6, DEFAULT_ACCUMS)


def test_select_cells_by_pattern_and_refuse_a_pattern_matching_nothing():
    cells = build_matrix(8, DEFAULT_ACCUMS, ("fp32", "bf16"))
    assert [c.name for c in select_cells(cells, "off-*-fp32,default-model-a1")] == [
        "off-a1-fp32", "off-a4-fp32", "off-a8-fp32", "default-model-a1-fp32", "default-model-a1-bf16"]
    assert select_cells(cells, None) == cells
    with pytest.raises(BenchError, match="matches no cell"):
        select_cells(cells, "off-a2")


def test_memory_table_adds_each_micro_batch_without_accumulation_and_a_larger_one():
    extra = memory_cells(build_matrix(8, DEFAULT_ACCUMS, ("fp32", "bf16")), 8)
    assert [(c.name, c.micro_batch, c.accum) for c in extra] == [
        ("off-a1-fp32-mb2", 2, 1), ("off-a1-fp32-mb1", 1, 1),  # b = E/k alone
        ("off-a4-fp32-mb8", 8, 4), ("off-a1-fp32-mb32", 32, 1)]  # b = E with accumulation, the plain batch E·k
    assert all(c.memory_only for c in extra)  # in the first precision only
    assert memory_cells(select_cells(build_matrix(8, DEFAULT_ACCUMS), "default-*"), 8) == []  # eager cells only


def test_modes_choose_the_compile_settings_crossed():
    from core.trials import parse_modes

    modes = parse_modes("off,max-autotune-no-cudagraphs,default-block")
    assert modes == (("off", "model"), ("max-autotune-no-cudagraphs", "model"), ("default", "block"))
    cells = build_matrix(8, (1, 2), ("bf16",), modes=modes)
    assert [c.name for c in cells] == ["off-a1-bf16", "off-a2-bf16", "max-autotune-no-cudagraphs-model-a1-bf16",
                                       "max-autotune-no-cudagraphs-model-a2-bf16", "default-block-a1-bf16",
                                       "default-block-a2-bf16"]
    for bad in ("reduce-overhead", "off-block", "fast", ""):
        with pytest.raises(BenchError):
            parse_modes(bad)


def test_the_memory_table_leaves_out_a_ratio_to_no_training_memory():
    """A micro-batch alone whose training used nothing measurable (a tiny model: its peak no higher than the
    baseline) made the accumulation's ratio a division by zero, the whole report lost."""
    from bench.report import _memory_table

    def cell(b, k, train):
        return {"mode": "off", "micro_batch": b, "accum": k, "precision": "fp32", "peak_gib": 0.5,
                "train_mem_gib": train}

    cells = {"off-a4": cell(2, 4, 0.01), "off-a1-mb2": cell(2, 1, 0.0), "off-a1-mb8": cell(8, 1, 0.02),
             "off-a2": cell(4, 2, 0.03), "off-a1-mb4": cell(4, 1, 0.02)}
    [row] = _memory_table(cells, grad_gib=0.001)
    assert (row["micro_batch"], row["accum"], row["accum_ratio"]) == (4, 2, 1.5)
