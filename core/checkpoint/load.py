"""Loading weights into a model (plain, compiled or DDP-wrapped): all or nothing."""

from __future__ import annotations

from pathlib import Path

import torch

from core.checkpoint.infer import infer_model_config, rope_theta_of
from core.checkpoint.keys import ROPE_TABLES, check_plain_tensors, clean_key, clean_state_dict, plain_module
from core.checkpoint.read import LoadedCheckpoint, read_checkpoint
from core.compile import CompiledModel
from core.config import ModelConfig
from core.errors import CheckpointError
from core.model import LlamaForCausalLM

# Config fields that change the math without changing any weight's shape: a
# checkpoint that differs in one of them would load "fine" and compute garbage.
_SHAPELESS_FIELDS = ("num_heads", "num_kv_heads", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
                     "max_position_embeddings")


def _more(items: list[str], shown: int = 3) -> str:
    return ", ".join(items[:shown]) + (f" (+{len(items) - shown} more)" if len(items) > shown else "")


def _check_rope_tables(plain: torch.nn.Module, tables: dict[str, torch.Tensor], source: str) -> None:
    """Rotary tables saved with the weights must be the model's own: another base or head size computes wrong."""
    rotary = getattr(getattr(plain, "model", None), "rotary_emb", None)
    cfg = getattr(plain, "config", None)
    if rotary is None or not isinstance(cfg, ModelConfig):
        return
    for key, table in tables.items():
        own = getattr(rotary, key.rsplit(".", 1)[-1]).detach().float().cpu()
        if table.ndim != 2 or table.shape[1] != own.shape[1]:
            raise CheckpointError(f"{source} holds rotary tables of shape {tuple(table.shape)} for head size "
                                  f"{table.shape[-1]}, but this model's head size is {cfg.head_dim}: the checkpoint "
                                  f"was trained with another head size (another number of attention heads)")
        rows = min(table.shape[0], own.shape[0])
        tolerance = 1e-3 if table.dtype in (torch.float32, torch.float64) else 2e-2  # tables saved in half precision
        if not torch.allclose(table[:rows].float(), own[:rows], atol=tolerance, rtol=0.0):
            cos = tables.get("model.rotary_emb.cos")
            theta = rope_theta_of(cos.float(), tolerance) if cos is not None else None
            fits = f" (its tables fit rope_theta ≈ {theta:.4g})" if theta else ""
            raise CheckpointError(f"the rotary tables in {source} differ from this model's (rope_theta "
                                  f"{cfg.rope_theta:g}, head size {cfg.head_dim}): the checkpoint was trained with "
                                  f"another RoPE base{fits}; give --config with its rope_theta")


def check_compatible(model: torch.nn.Module | CompiledModel, state: dict[str, torch.Tensor],
                     source: str = "checkpoint") -> None:
    """Raise CheckpointError naming the first differences; change nothing."""
    check_plain_tensors(state, source)
    plain = plain_module(model)
    tables = {k: v for k, v in state.items() if k in ROPE_TABLES}
    state = {k: v for k, v in state.items() if k not in ROPE_TABLES}
    expected = clean_state_dict(plain.state_dict())
    tied = getattr(getattr(plain, "config", None), "tie_word_embeddings", False)
    if tied:
        expected.pop("lm_head.weight", None)
        head, embed = state.get("lm_head.weight"), state.get("model.embed_tokens.weight")
        if head is not None and not (embed is not None and head.shape == embed.shape and torch.equal(head, embed)):
            raise CheckpointError(f"{source} has its own output head (lm_head.weight), but this model ties "
                                  f"the head to the embedding")
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    mismatched = [f"{k}: expected {tuple(expected[k].shape)}, found {tuple(state[k].shape)}"
                  for k in expected if k in state and expected[k].shape != state[k].shape]
    if mismatched:
        raise CheckpointError(f"architecture mismatch with {source}: {_more(mismatched)}")
    _check_rope_tables(plain, tables, source)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys {_more(missing)}")
        if unexpected:
            parts.append(f"unexpected keys {_more(unexpected)}")
        raise CheckpointError(f"{source} does not match the model: " + "; ".join(parts))
    check_weight_dtypes(state, source)


def check_weight_dtypes(state: dict[str, torch.Tensor], source: str) -> None:
    """Refuse weights that are not fp32, bf16, fp16 or fp64: integers, booleans and complex numbers are no
    weights, and float8 ones are quantized (their scales live elsewhere, a plain cast would be wrong)."""
    bad = [k for k, v in state.items() if not v.is_floating_point()]
    if bad:
        raise CheckpointError(f"{source} holds non-float tensors for weights: {_more(bad)}")
    packed = [f"{k} ({v.dtype})".replace("torch.", "") for k, v in state.items() if v.dtype not in LOADABLE_DTYPES]
    if packed:
        raise CheckpointError(f"{source} holds quantized weights ({_more(packed)}): only fp32, bf16, fp16 and "
                              f"fp64 weights load; dequantize them first")


LOADABLE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def model_shapes(model_config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight a model of ``model_config`` loads, by clean name, with its shape (rotary tables and a
    tied head left out). Built on the meta device: no memory, no data, a few milliseconds."""
    with torch.device("meta"):
        model = LlamaForCausalLM(model_config)
    shapes = {k: tuple(v.shape) for k, v in clean_state_dict(model.state_dict()).items() if k not in ROPE_TABLES}
    if model_config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    return shapes


def shape_problem(model_config: ModelConfig, found: dict[str, tuple[int, ...]],
                  source: str = "checkpoint") -> str | None:
    """Why weights of these shapes (clean names, e.g. ``tensor_shapes``) cannot load into a model of
    ``model_config``, naming the first differing keys and shapes; None when they fit.

    The same verdict as ``check_compatible`` as far as shapes tell it, without reading a weight: for
    checking a file before a run is started from it. (Whether a head saved beside a tied embedding
    holds the embedding's values is for the load to check.)
    """
    expected = model_shapes(model_config)
    found = {k: tuple(v) for k, v in found.items() if k not in ROPE_TABLES}
    head = found.get("lm_head.weight")
    if model_config.tie_word_embeddings and head is not None:
        if head != found.get("model.embed_tokens.weight"):
            return (f"{source} has its own output head (lm_head.weight {head}), but this model ties the head "
                    f"to the embedding")
        del found["lm_head.weight"]  # a tied head saved twice: the embedding's copy
    mismatched = [f"{k}: expected {expected[k]}, found {found[k]}"
                  for k in expected if k in found and expected[k] != found[k]]
    if mismatched:
        return f"architecture mismatch with {source}: {_more(mismatched)}"
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    if missing or unexpected:
        parts = ([f"missing keys {_more(missing)}"] if missing else []) + \
                ([f"unexpected keys {_more(unexpected)}"] if unexpected else [])
        return f"{source} does not match the model: " + "; ".join(parts)
    return None


def load_weights(model: torch.nn.Module | CompiledModel, state: dict[str, torch.Tensor],
                 source: str = "checkpoint") -> None:
    """Copy ``state`` into ``model`` (plain, compiled whole or per block, or DDP), all or nothing.

    Weights are copied in place, so a model compiled before the load computes
    with the new values without recompiling.
    """
    state = clean_state_dict(state, source)
    check_compatible(model, state, source)
    plain = plain_module(model)
    params = dict(plain.named_parameters())
    params.update(dict(plain.named_buffers()))
    with torch.no_grad():
        for key, value in state.items():
            target = params.get(key)
            if target is None or key in ROPE_TABLES:  # the tied head (the embedding's tensor); derived tables
                continue
            target.copy_(value.to(dtype=target.dtype))


def check_finite(state: dict[str, torch.Tensor], source: str, instead: str) -> None:
    """Refuse weights that hold NaN or inf (saved from a diverged or damaged model), naming the first tensor
    that does; ``instead`` says what to do. Checked where the weights were read (the CPU): no device sync.
    Training, generation and export all refuse them: a NaN in an attention projection that CPU attention
    hides from the outputs still makes every output wrong."""
    for key, value in state.items():
        # Other dtypes (integers, float8) are refused by the load, in their own words.
        if value.dtype in LOADABLE_DTYPES and not bool(torch.isfinite(value).all()):
            raise CheckpointError(f"the weights of {source} are not finite (NaN or inf in {clean_key(key)}): it "
                                  f"was saved from a diverged or damaged model; {instead}")


def check_config_matches(model: torch.nn.Module | CompiledModel, model_config: ModelConfig,
                         source: str = "checkpoint") -> None:
    """Refuse a checkpoint whose architecture differs in a way weight shapes do not show."""
    current = getattr(plain_module(model), "config", None)
    if not isinstance(current, ModelConfig):
        return
    diffs = [f"{name}: expected {getattr(current, name)!r}, found {getattr(model_config, name)!r}"
             for name in _SHAPELESS_FIELDS if getattr(current, name) != getattr(model_config, name)]
    if diffs:
        raise CheckpointError(f"architecture mismatch with {source}: {_more(diffs)}")


def load_checkpoint(model: torch.nn.Module | CompiledModel, path: str | Path) -> LoadedCheckpoint:
    """Read ``path`` (any format) and load its weights into ``model``, all or nothing."""
    loaded = read_checkpoint(path)
    check_compatible(model, loaded.state_dict, str(loaded.source))  # shapes first: the clearest message
    if loaded.model_config is not None:
        check_config_matches(model, loaded.model_config, str(loaded.source))
    load_weights(model, loaded.state_dict, str(loaded.source))
    return loaded


def model_from_checkpoint(path: str | Path,
                          model_config: ModelConfig | None = None) -> tuple[torch.nn.Module, LoadedCheckpoint]:
    """A new (uncompiled, CPU) model built from the checkpoint's own config, with its weights.

    A bare state dict carries no config: ``model_config`` names its architecture,
    or else it is read from the tensors' shapes where they tell it (see ``core.checkpoint.infer``).
    """
    loaded = read_checkpoint(path)
    config = loaded.model_config or model_config or infer_model_config(loaded.state_dict, str(loaded.source))
    model = LlamaForCausalLM(config)
    load_weights(model, loaded.state_dict, str(loaded.source))
    return model, loaded
