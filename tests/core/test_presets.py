"""Preset sizes promised by the README."""

from core.config import PRESETS, config_from_preset


def test_tiny_is_at_most_two_million_parameters():
    assert PRESETS["tiny"].model.num_parameters() <= 2_000_000


def test_small_is_twenty_to_thirty_million():
    assert 20e6 <= PRESETS["small"].model.num_parameters() <= 30e6


def test_base_is_the_reference_configuration():
    m = PRESETS["base"].model
    assert (m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads) == (768, 12, 12, 3)
    assert (m.intermediate_size, m.max_position_embeddings, m.rms_norm_eps, m.vocab_size) == (3072, 2048, 1e-5, 50_000)


def test_effective_batch_is_derived():
    cfg = config_from_preset("tiny", train={"micro_batch": 4, "accum_steps": 8})
    assert cfg.train.sequences_per_step() == 32
    assert cfg.tokens_per_step() == 32 * cfg.data.seq_len
    assert cfg.tokens_per_step(world_size=2) == 64 * cfg.data.seq_len
