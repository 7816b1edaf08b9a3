"""Gradient accumulation is exact: any split of a global batch gives the same step."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_pre_hook

from core.data import IGNORE_INDEX, prepare_data
from core.events import ListSink, StepMetrics, ValidationDone
from core.model import LlamaForCausalLM
from core.trainer import Trainer


@pytest.fixture(scope="module")
def uneven_corpus(tmp_path_factory):
    """Documents from 2 to 60 words: in the document layout micro-batches hold very different token counts."""
    path = tmp_path_factory.mktemp("corpus") / "uneven.jsonl"
    words = "the quick brown fox jumps over a lazy dog while the cat sleeps".split()
    rows = [" ".join(words[j % len(words)] for j in range(2 + (i * 7) % 59)) for i in range(120)]
    path.write_text("\n".join(json.dumps({"text": r}) for r in rows))
    return str(path)


def one_step(micro, layout: str, source: str, mb: int, accum: int, **train):
    cfg = micro(data={"layout": layout, "source": source, "vocab_size": 300},
                train={"micro_batch": mb, "accum_steps": accum, "budget": 1, "warmup_ratio": 0.0, **train})
    sink = ListSink()
    trainer = Trainer(cfg, sink=sink)
    trainer.run()
    params = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    return params, sink.of(StepMetrics)[0].loss


def assert_same_params(a, b, atol=2e-6):
    for key in a:
        assert torch.allclose(a[key], b[key], atol=atol, rtol=0), (key, (a[key] - b[key]).abs().max())


@pytest.mark.parametrize("layout", ["packed", "document"])
def test_micro_batch_split_gives_the_same_parameters(micro, uneven_corpus, layout):
    ref, ref_loss = one_step(micro, layout, uneven_corpus, 8, 1)
    for mb, accum in ((2, 4), (1, 8)):
        params, loss = one_step(micro, layout, uneven_corpus, mb, accum)
        assert_same_params(ref, params)
        assert loss == pytest.approx(ref_loss, rel=1e-5)  # the logged loss is the true window mean


@pytest.mark.parametrize("layout", ["packed", "document"])
def test_validation_reads_the_same_samples_for_every_split(micro, uneven_corpus, layout):
    """Splits of one global batch train the same weights, so they report the same validation loss: the
    held-out samples follow the global batch, not the micro-batch (also once one is halved after an OOM)."""
    losses = []
    for mb, accum in ((8, 1), (2, 4), (1, 8)):
        cfg = micro(data={"layout": layout, "source": uneven_corpus, "vocab_size": 300},
                    train={"micro_batch": mb, "accum_steps": accum, "budget": 1, "warmup_ratio": 0.0,
                           "eval_batches": 1})
        sink = ListSink()
        Trainer(cfg, sink=sink).run()
        losses.append(sink.of(ValidationDone)[-1].loss)
    assert losses == pytest.approx([losses[0]] * 3, rel=1e-5)


def test_right_padding_needs_no_mask_for_the_loss_and_its_gradients(micro, uneven_corpus):
    """The trainer passes no attention mask (causal kernels, no K/V copies): with right padding, causal
    attention keeps padding from every real query, so the loss and every gradient are those with the mask."""
    data = prepare_data(micro(data={"layout": "document", "source": uneven_corpus, "vocab_size": 300}).data)
    torch.manual_seed(0)
    model = LlamaForCausalLM(dataclasses.replace(micro().model, vocab_size=data.tokenizer.vocab_size))
    batch = data.train.batch(list(range(8)))
    assert (batch.attention_mask == 0).any()  # some rows are padded
    results = []
    for mask in (batch.attention_mask, None):
        model.zero_grad()
        loss = model(batch.inputs, mask, targets=batch.targets)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (with_mask, grads), (without, grads_without) = results
    assert torch.allclose(with_mask, without, rtol=1e-6, atol=0)
    for name, grad in grads.items():
        assert torch.allclose(grad, grads_without[name], rtol=1e-4, atol=1e-6), name


def test_dividing_by_accumulation_steps_would_be_wrong(micro, uneven_corpus):
    """Negative control: per-micro-batch means / accum differ from the window mean when token counts differ."""
    data = prepare_data(micro(data={"layout": "document", "source": uneven_corpus, "vocab_size": 300}).data)
    torch.manual_seed(0)
    model = LlamaForCausalLM(dataclasses.replace(micro().model, vocab_size=data.tokenizer.vocab_size))
    window = data.train.batch(list(range(8)))

    def loss_of(batch):
        logits = model(batch.inputs, batch.attention_mask)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), batch.targets.view(-1),
                               ignore_index=IGNORE_INDEX, reduction="sum")

    with torch.no_grad():
        exact = loss_of(window) / window.num_targets
        naive = sum(loss_of(window.slice(i, i + 2)) / window.slice(i, i + 2).num_targets for i in range(0, 8, 2)) / 4
    counts = [window.slice(i, i + 2).num_targets for i in range(0, 8, 2)]
    assert len(set(counts)) > 1
    assert abs(float(exact - naive)) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("scope, layout", [("model", "document"), ("block", "packed")])
def test_compiled_accumulation_matches_eager(micro, uneven_corpus, scope, layout):
    ref, ref_loss = one_step(micro, layout, uneven_corpus, 4, 1)
    params, loss = one_step(micro, layout, uneven_corpus, 2, 2, compile_mode="default", compile_scope=scope)
    assert_same_params(ref, params, atol=1e-5)
    assert loss == pytest.approx(ref_loss, rel=1e-4)


# bf16 autocast: the same exactness, at bf16's tolerance. Adam's first step moves each
# weight by about ±lr whatever the gradient's size, so parameters would hide or inflate a
# bf16 rounding difference: these tests compare the accumulated gradients the optimizer
# receives (grad_clip 0 leaves them as the window made them).
BF16_GRAD_RTOL = 2e-2  # of each tensor's largest gradient: bf16 keeps 8 bits of mantissa (2^-8 ≈ 4e-3)


def step_gradients(micro, layout: str, source: str, mb: int, accum: int, **train):
    """The gradients of one optimizer step (as ``optimizer.step`` sees them) and its logged loss."""
    grads = []

    def capture(optimizer, args, kwargs):
        grads.append([p.grad.detach().clone() for group in optimizer.param_groups for p in group["params"]])

    handle = register_optimizer_step_pre_hook(capture)
    try:
        _, loss = one_step(micro, layout, source, mb, accum, grad_clip=0.0, **train)
    finally:
        handle.remove()
    assert len(grads) == 1
    return grads[0], loss


def assert_close_grads(a, b, rtol=BF16_GRAD_RTOL):
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        scale = x.abs().max().clamp_min(1e-12)
        assert (x - y).abs().max() <= rtol * scale, (i, float((x - y).abs().max() / scale))


@pytest.mark.parametrize("layout", ["packed", "document"])
def test_bf16_micro_batch_split_gives_the_same_gradients(micro, uneven_corpus, layout):
    ref, ref_loss = step_gradients(micro, layout, uneven_corpus, 8, 1, precision="bf16")
    for mb, accum in ((2, 4), (1, 8)):
        grads, loss = step_gradients(micro, layout, uneven_corpus, mb, accum, precision="bf16")
        assert_close_grads(ref, grads)
        assert loss == pytest.approx(ref_loss, rel=1e-2)


def test_bf16_gradients_agree_with_fp32(micro, uneven_corpus):
    """bf16 autocast changes the rounding, not the math: the same window's gradients within bf16's tolerance."""
    ref, ref_loss = step_gradients(micro, "document", uneven_corpus, 4, 2)
    grads, loss = step_gradients(micro, "document", uneven_corpus, 4, 2, precision="bf16")
    assert_close_grads(ref, grads, rtol=5e-2)
    assert loss == pytest.approx(ref_loss, rel=1e-2)


@pytest.mark.slow
def test_bf16_compiled_accumulation_matches_eager(micro, uneven_corpus):
    """The loss compiled inside the model's graph (whole-model scope) gives eager's gradients in bf16."""
    ref, ref_loss = step_gradients(micro, "document", uneven_corpus, 4, 1, precision="bf16")
    grads, loss = step_gradients(micro, "document", uneven_corpus, 2, 2, precision="bf16",
                                 compile_mode="default", compile_scope="model")
    assert_close_grads(ref, grads)
    assert loss == pytest.approx(ref_loss, rel=1e-2)
