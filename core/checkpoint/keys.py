"""State-dict keys: the wrapper parts torch.compile and DDP add, removed wherever they appear, and other
layouts of the same Llama weights mapped to Hugging Face's names.

Layouts read besides Hugging Face's own (``model.embed_tokens.weight`` …, ``lm_head.weight``):

- the article series' ``LlamaForPretraining`` ("Pretraining a Llama Model on Your Local GPU"):
  ``base_model.embed_tokens.weight`` …, ``lm_head.weight``, plus its rotary tables
  ``base_model.rotary_emb.cos``/``sin`` ([positions, head size]);
- any of these one level down, as a Lightning module holding the model as ``self.model``
  saves it (``model.model.…``, ``model.base_model.…``, ``model.lm_head.weight``).

Rotary tables are derived from the config here, never loaded: ``ROPE_TABLES`` names
them after mapping, and loading checks them against the model's own (``core.checkpoint.load``).
"""

from __future__ import annotations

import torch

from core.compile import CompiledModel, unwrap
from core.errors import CheckpointError

_WRAPPER_PARTS = ("_orig_mod",)
_DROPPED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers older HF checkpoints saved; derived here
_BODIES = ("model", "base_model")
"""What the decoder (embedding, layers, final norm) is called beside ``lm_head``: HF's name, the article series'."""
ROPE_TABLES = ("model.rotary_emb.cos", "model.rotary_emb.sin")
"""Rotary tables some layouts save ([positions, head size]); checked against the model's, then dropped."""


def clean_key(key: str) -> str:
    """Remove wrapper components: ``_orig_mod`` anywhere (whole-model or per-block
    torch.compile) and leading ``module`` (DDP), in any mix."""
    parts = [p for p in key.split(".") if p not in _WRAPPER_PARTS]
    while parts and parts[0] == "module":
        parts.pop(0)
    return ".".join(parts)


def _layout(keys: list[str]) -> tuple[str, str] | None:
    """``(root, body)`` of a Llama layout, from the one token-embedding key: ``("", "model")`` is HF's own.

    ``root`` is what holds the whole model (``"model."`` in a Lightning module);
    ``body`` names the decoder (``model`` or the article series' ``base_model``).
    """
    embeds = [k for k in keys if k.endswith("embed_tokens.weight")]
    if len(embeds) != 1:
        return None
    parts = embeds[0].split(".")[:-2]
    if not parts or parts[-1] not in _BODIES:
        return None
    return "".join(p + "." for p in parts[:-1]), parts[-1]


def _mapper(keys: list[str]):
    """A function from a key of this layout to HF's name (keys outside the layout stay as they are)."""
    layout = _layout(keys)
    if layout is None or layout == ("", "model"):
        return lambda key: key
    root, body = layout
    head = f"{root}lm_head."

    def to_hf(key: str) -> str:
        if key.startswith(f"{root}{body}."):
            return "model." + key[len(root) + len(body) + 1:]
        if key.startswith(head):
            return "lm_head." + key[len(head):]
        return key

    return to_hf


def check_plain_tensors(state: dict[str, torch.Tensor], source: str) -> None:
    """Refuse what no weight can be copied from: a tensor that is sparse, quantized, nested or on the meta
    device (a shape without values). Checked before anything is copied: a copy that failed half-way left the
    weights before it overwritten (38 of 39 tensors, then the meta one raised). Keys: ``clean_state_dict``."""
    for key, value in state.items():
        kind = ("not a tensor" if not isinstance(value, torch.Tensor) else
                "on the meta device: a shape without values" if value.is_meta else
                f"{value.layout} (not dense)".replace("torch.", "") if value.layout != torch.strided else
                "quantized" if value.is_quantized else "nested" if value.is_nested else None)
        if kind is not None:
            raise CheckpointError(f"{source} holds a tensor no weight can be loaded from: {key} is {kind}")


def clean_state_dict(state: dict[str, torch.Tensor], source: str = "the state dict") -> dict[str, torch.Tensor]:
    """Keys without wrapper parts, in HF's names (see the module doc); derived buffers other than the
    rotary tables dropped. A key that is not text is a ``CheckpointError`` naming ``source``."""
    cleaned: dict[str, str] = {}
    odd = next((k for k in state if not isinstance(k, str)), None)
    if odd is not None:
        raise CheckpointError(f"{source} is no model state dict: it names a tensor {odd!r} "
                              f"({type(odd).__name__}), not by text")
    for key in state:
        new = clean_key(key)
        if new in cleaned:
            raise CheckpointError(f"two entries map to the same parameter {new!r} ({key!r})")
        cleaned[new] = key
    to_hf = _mapper(list(cleaned))
    out: dict[str, torch.Tensor] = {}
    for name, key in cleaned.items():
        new = to_hf(name)
        if new.endswith(_DROPPED_SUFFIXES):
            continue
        if new in out:
            raise CheckpointError(f"two entries map to the same parameter {new!r} ({key!r})")
        out[new] = state[key]
    return out


def plain_module(model: torch.nn.Module | CompiledModel) -> torch.nn.Module:
    """The uncompiled module under a ``CompiledModel``, torch.compile and DDP wrappers."""
    if isinstance(model, CompiledModel):
        model = model.model
    return unwrap(model)


def model_state_dict(model: torch.nn.Module | CompiledModel) -> dict[str, torch.Tensor]:
    """Weights of the plain module on the CPU, with plain names (never ``_orig_mod.``)."""
    plain = plain_module(model)
    # clean_state_dict as well: per-block wrappers registered as submodules
    # (``layers[i] = torch.compile(layers[i])``) put ``_orig_mod`` mid-key.
    state = clean_state_dict(plain.state_dict())
    if getattr(getattr(plain, "config", None), "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # tied: stored once, as HF does
    return {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
