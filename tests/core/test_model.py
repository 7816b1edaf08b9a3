"""The model: Hugging Face names and math, causality, padding."""

from __future__ import annotations

import pytest
import torch

from core.config import ModelConfig
from core.errors import ConfigError, NotFinite
from core.model import LlamaForCausalLM

CFG = ModelConfig(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                  intermediate_size=48, max_position_embeddings=64)


def make_model(cfg: ModelConfig = CFG, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def test_parameter_names_are_hugging_face_llama():
    keys = set(make_model().state_dict())
    expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(CFG.num_layers):
        p = f"model.layers.{i}."
        expected |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        expected |= {p + f"self_attn.{n}_proj.weight" for n in "qkvo"}
        expected |= {p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")}
    assert keys == expected


def test_shapes_and_parameter_count():
    model = make_model()
    sd = model.state_dict()
    kv = CFG.num_kv_heads * CFG.head_dim
    assert sd["model.layers.0.self_attn.q_proj.weight"].shape == (32, 32)
    assert sd["model.layers.0.self_attn.k_proj.weight"].shape == (kv, 32)
    assert sd["model.layers.0.mlp.gate_proj.weight"].shape == (48, 32)
    assert sd["lm_head.weight"].shape == (97, 32)
    assert model.num_parameters() == CFG.num_parameters()
    assert not any(name.endswith("bias") for name in sd)


def test_tied_embeddings_share_one_tensor():
    model = make_model(ModelConfig(**{**CFG.to_dict(), "tie_word_embeddings": True}))
    assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_matches_transformers_llama(attention):
    """Against transformers' sdpa attention the logits are the same to the bit (the README's "zero difference");
    its eager attention (a softmax of its own) differs by fp32 rounding."""
    transformers = pytest.importorskip("transformers")
    ours = make_model()
    hf_cfg = {k: v for k, v in CFG.to_hf_dict().items() if k != "architectures"}
    theirs = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf_cfg, attn_implementation=attention)).eval()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randint(0, CFG.vocab_size, (2, 20))
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, 12:] = 0
    with torch.no_grad():
        pairs = [(ours(x), theirs(x).logits),
                 (ours(x, mask)[1, :12], theirs(x, attention_mask=mask).logits[1, :12])]
    for mine, hf in pairs:
        if attention == "sdpa":
            assert torch.equal(mine, hf), (mine - hf).abs().max()
        else:
            assert torch.allclose(mine, hf, atol=1e-5)


def test_causality_future_tokens_never_change_earlier_logits():
    model = make_model()
    x = torch.randint(0, CFG.vocab_size, (1, 24))
    y = x.clone()
    y[0, 10:] = torch.randint(0, CFG.vocab_size, (14,))
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.equal(a[0, :10], b[0, :10])
    assert not torch.allclose(a[0, 10:], b[0, 10:])


def test_padding_never_changes_real_tokens():
    model = make_model()
    x = torch.randint(3, CFG.vocab_size, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[0, 9:] = 0
    y = x.clone()
    y[0, 9:] = torch.randint(3, CFG.vocab_size, (7,))  # other garbage in the padded slots
    with torch.no_grad():
        a, b = model(x, mask), model(y, mask)
        unpadded = model(x[:1, :9])
    assert torch.allclose(a[0, :9], b[0, :9], atol=1e-6)
    assert torch.allclose(a[0, :9], unpadded[0], atol=1e-5)
    assert torch.isfinite(a).all()


def test_left_padding_stays_finite_and_matches():
    """A fully padded prefix must not produce NaN that leaks into real tokens."""
    model = make_model()
    x = torch.randint(3, CFG.vocab_size, (1, 12))
    mask = torch.ones(1, 12, dtype=torch.long)
    mask[0, :4] = 0
    with torch.no_grad():
        out = model(x, mask)
    assert torch.isfinite(out).all()


def test_rope_theta_changes_the_math():
    x = torch.randint(0, CFG.vocab_size, (1, 16))
    a = make_model(CFG, 0)
    b = LlamaForCausalLM(ModelConfig(**{**CFG.to_dict(), "rope_theta": 500_000.0})).eval()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        assert not torch.allclose(a(x), b(x))


@pytest.mark.parametrize("kwargs, message", [
    ({"hidden_size": 30, "num_heads": 4}, "not divisible by num_heads"),
    ({"num_heads": 4, "num_kv_heads": 3}, "not divisible by num_kv_heads"),
    ({"hidden_size": 12, "num_heads": 4, "num_kv_heads": 2}, "must be even"),
    ({"num_layers": 0}, "positive integer"),
])
def test_invalid_model_configs_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**{**CFG.to_dict(), **kwargs})


def test_greedy_generation_is_deterministic():
    model = make_model()
    prompt = torch.tensor([[1, 5, 7]])
    a = model.generate(prompt, 5)
    b = model.generate(prompt, 5)
    assert a.shape == (1, 8) and torch.equal(a, b)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_forward_with_targets_is_the_summed_fp32_loss_of_the_logits(dtype):
    """The loss the Trainer gets from ``forward(targets=…)`` is cross-entropy over the logits, summed, in fp32,
    skipping IGNORE_INDEX, with the same gradients; under bf16 autocast as well."""
    import torch.nn.functional as F

    from core.data import IGNORE_INDEX

    model = make_model().train()
    ids = torch.randint(0, CFG.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    targets = ids.roll(-1, dims=1)
    targets[0, :3] = IGNORE_INDEX
    amp = torch.autocast("cpu", dtype=dtype, enabled=dtype is not None)
    with amp:
        loss = model(ids, targets=targets)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with amp:
        logits = model(ids)
    ref = F.cross_entropy(logits.float().view(-1, CFG.vocab_size), targets.view(-1), reduction="none")
    ref = ref[targets.view(-1) != IGNORE_INDEX].sum()
    ref.backward()
    assert loss.dtype == torch.float32
    assert torch.equal(loss, ref) or loss.item() == pytest.approx(ref.item(), rel=1e-6)
    for g, p in zip(grads, model.parameters(), strict=True):
        assert torch.allclose(g, p.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_generating_from_weights_that_are_not_finite_says_so(temperature):
    model = make_model()
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))
    with pytest.raises(NotFinite, match="outputs are not finite"):
        model.generate(torch.tensor([[1, 2, 3]]), 4, temperature=temperature, top_k=5)


@pytest.mark.parametrize("temperature", [1e-38, 1e-320, 5e-324])
def test_a_tiny_positive_temperature_samples_like_greedy_not_nan(temperature):
    model = make_model().eval()
    prompt = torch.tensor([[1, 2, 3]])
    greedy = model.generate(prompt, 6, temperature=0.0)
    sampled = model.generate(prompt, 6, temperature=temperature, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sampled, greedy)


@pytest.mark.parametrize("top_k", [None, 1])
def test_a_huge_temperature_samples_among_the_allowed_tokens(top_k):
    model = make_model().eval()
    prompt = torch.tensor([[1, 2, 3]])
    out = model.generate(prompt, 8, temperature=1e300, top_k=top_k, generator=torch.Generator().manual_seed(0))
    assert out.shape == (1, 11) and 0 <= int(out.min()) and int(out.max()) < CFG.vocab_size
    if top_k == 1:  # only the most likely token is allowed, however flat the temperature makes the rest
        assert torch.equal(out, model.generate(prompt, 8, temperature=0.0))


@pytest.mark.parametrize(("sizes", "says"), [({"max_position_embeddings": 10**12}, "rotary tables"),
                                             ({"hidden_size": 2**20, "num_heads": 2**14, "num_kv_heads": 2**14,
                                               "intermediate_size": 2**20}, "weights")])
def test_a_model_no_memory_holds_is_one_line_before_anything_is_allocated(sizes, says):
    """From a config file or a checkpoint's config.json: 10**12 positions asked the allocator for 4 TB of rotary
    tables (a traceback, or a process killed by the OS); shapes alone, on the meta device, still work."""
    import dataclasses

    cfg = dataclasses.replace(CFG, **sizes)
    with pytest.raises(ConfigError, match=f"{says}.*GiB of available RAM; choose a smaller model"):
        LlamaForCausalLM(cfg)
    with torch.device("meta"):
        assert LlamaForCausalLM(cfg).config == cfg


def test_training_a_model_no_memory_holds_is_refused_before_its_corpus_or_auto_precision(tmp_path, monkeypatch):
    """auto's probe builds one layer of the model: it came before the memory check, and so did the corpus'
    preparation (minutes on a large one)."""
    import core.precision
    from core.trainer import train
    from tests.conftest import micro_config

    def probe(*args, **kwargs):
        raise AssertionError("the precision probe or the data preparation ran")

    monkeypatch.setattr(core.precision, "decide_precision", probe)
    monkeypatch.setattr("core.trainer.decide_precision", probe, raising=False)
    monkeypatch.setattr("core.trainer.prepare_data", probe)
    cfg = micro_config(tmp_path, model={"max_position_embeddings": 10**12}, train={"precision": "auto"})
    with pytest.raises(ConfigError, match="the model alone needs .*the tables of its positions alone"):
        train(cfg)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("padded", [False, True])
def test_attention_runs_in_fp32_under_cpu_bf16_autocast(monkeypatch, padded):
    """bf16 attention alone made bf16 training trail fp32 (docs/benchmarks.md): on a CPU it gets fp32 inputs
    with autocast off, and the projections around it stay bf16; the backward runs through it."""
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, *args, **kwargs):
        seen.append(((q.dtype, k.dtype, v.dtype), torch.is_autocast_enabled("cpu")))
        return sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    model = make_model()
    x = torch.randint(3, CFG.vocab_size, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[0, 12:] = 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x, mask if padded else None)
    assert logits.dtype == torch.bfloat16  # the output head still ran in bf16
    assert seen == [((torch.float32,) * 3, False)] * CFG.num_layers
    logits.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())

    seen.clear()
    with torch.no_grad():
        model(x, mask if padded else None)  # fp32: as it was
    assert seen == [((torch.float32,) * 3, False)] * CFG.num_layers
