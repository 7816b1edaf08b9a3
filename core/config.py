"""Configuration dataclasses and presets.

Three dataclasses describe a run: ``ModelConfig`` (the architecture),
``DataConfig`` (corpus, tokenizer and sample layout) and ``TrainConfig``
(optimizer, schedule, speedups, budget). ``RunConfig`` bundles them and checks
the combinations. All validation happens in ``__post_init__`` and raises
``ConfigError`` (a ``ValueError``) with a message a user can act on.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field, fields
from typing import Any

from core.errors import ConfigError

COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Modes that capture CUDA graphs. Their replay with gradient accumulation has
# produced silently wrong gradients in some PyTorch releases; see TrainConfig.
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
COMPILE_SCOPES = ("model", "block")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
LAYOUTS = ("packed", "document")
BUDGET_KINDS = ("steps", "tokens", "epochs")
BUILTIN_CORPUS = "builtin"


def _require(cond: bool, message: str, field: str | None = None) -> None:
    """Raise ConfigError(message) naming ``field``, the setting at fault, unless ``cond`` holds."""
    if not cond:
        raise ConfigError(message, field)


_RUN_FIELDS = ("out_dir", "resume", "init_from", "parent", "name")
"""A RunConfig's fields beside its sections and preset."""

_KINDS = {"int": "an integer", "float": "a finite number", "bool": "true or false", "str": "text"}
MAX_SEED = 2**63 - 1
"""Seeds are non-negative and fit a signed 64-bit integer (numpy's SeedSequence, torch.manual_seed)."""
MAX_COUNT = 2**63 - 1
"""Every integer setting, and the counts made of them (tokens per step, the budget in tokens), fit a
signed 64-bit integer: the counters of torch and numpy they end up in."""


def _check_types(obj) -> None:
    """Every field holds a value of its annotated type: integers are not booleans, numbers are finite.

    Runs first in each ``__post_init__``, so a config read from any JSON shape is
    either valid or one line naming the field.
    """
    for f in fields(obj):
        value = getattr(obj, f.name)
        kind = str(f.type).replace(" ", "")
        if kind.endswith("|None"):
            if value is None:
                continue
            kind = kind.removesuffix("|None")
        if kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
            _require(not ok or abs(value) <= MAX_COUNT or f.name == "seed",  # seeds: their own, narrower range
                     f"{f.name.replace('_', ' ')} must be at most 2**63 - 1 in size, got {value!r}", f.name)
        elif kind == "float":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        elif kind == "bool":
            ok = isinstance(value, bool)
        elif kind == "str":
            ok = isinstance(value, str)
        else:
            continue  # nested configs check themselves
        _require(ok, f"{f.name.replace('_', ' ')} must be {_KINDS[kind]}, got {value!r}", f.name)


def _refuse_unknown(keys, known, where: str) -> None:
    """A key a user wrote that no setting has (a typo would otherwise be silently ignored): a ConfigError."""
    unknown = [k for k in keys if k not in known]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), sorted(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown key {unknown[0]!r} in {where}{hint}", str(unknown[0]))


def _from_dict(cls, data: Any, section: str | None = None, *, strict: bool = False):
    """Build a dataclass from a dict; any other shape is a ConfigError.

    Unknown keys are ignored (checkpoints of older/newer versions), unless ``strict``:
    a file a user wrote, where an unknown key is a mistake.
    """
    if not isinstance(data, dict):
        what = f"the {section} section" if section else f"a {cls.__name__}"
        raise ConfigError(f"{what} must be a JSON object, got {type(data).__name__}", section)
    names = {f.name for f in fields(cls)}
    if strict:
        _refuse_unknown(data, names, f"the {section} section" if section else cls.__name__)
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-style decoder. Names follow Hugging Face's ``LlamaConfig``."""

    vocab_size: int = 2048
    """Rows of the embedding and output head; set to the tokenizer's size at run start."""
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    """Key/value heads for grouped-query attention; must divide ``num_heads``."""
    intermediate_size: int = 384
    """Width of the SwiGLU MLP."""
    max_position_embeddings: int = 256
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10_000.0
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        _check_types(self)
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "intermediate_size", "max_position_embeddings"):
            value = getattr(self, name)
            _require(value >= 1, f"{name} must be a positive integer, got {value!r}", name)
        _require(self.hidden_size % self.num_heads == 0,
                 f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}", "num_heads")
        _require(self.num_heads % self.num_kv_heads == 0,
                 f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.num_kv_heads}", "num_kv_heads")
        _require(self.head_dim % 2 == 0, f"head dimension {self.head_dim} must be even for rotary embeddings",
                 "num_heads")
        _require(self.rms_norm_eps > 0, "rms_norm_eps must be positive", "rms_norm_eps")
        _require(self.rope_theta > 0, "rope_theta must be positive", "rope_theta")
        _require(self.initializer_range >= 0, "initializer_range must be ≥ 0", "initializer_range")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def num_parameters(self) -> int:
        """Parameter count, computed from the shapes (no model needed)."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        per_layer = h * h * 2 + h * kv * 2 + 3 * h * self.intermediate_size + 2 * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_layers * per_layer + h + head

    def same_architecture(self, other: ModelConfig) -> bool:
        """Everything but the vocabulary alike: ``other`` is this preset's model, whatever its tokenizer."""
        return dataclasses.replace(self, vocab_size=other.vocab_size) == other

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, strict: bool = False) -> ModelConfig:
        return _from_dict(cls, data, "model", strict=strict)

    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` that ``transformers.LlamaConfig`` reads."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "initializer_range": self.initializer_range,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "attention_dropout": 0.0,
            "torch_dtype": "float32",
        }

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any]) -> ModelConfig:
        """Read a Hugging Face Llama ``config.json``; refuse what this model cannot express."""
        if hf.get("model_type", "llama") != "llama":
            raise ConfigError(f"not a Llama config (model_type={hf.get('model_type')!r})")
        # transformers < 5 writes a scaled RoPE as rope_scaling, ≥ 5 as rope_parameters (rope_scaling: null):
        # either one that is not plain RoPE would load here as plain RoPE, with other logits.
        for key in ("rope_scaling", "rope_parameters"):
            rope = hf.get(key)
            if rope is not None and not isinstance(rope, dict):
                raise ConfigError(f"{key} {rope!r} is not a mapping")
            if rope and rope.get("rope_type", rope.get("type")) not in (None, "default"):
                raise ConfigError(f"{key} {rope!r} is not supported (only plain rotary embeddings)")
        if hf.get("attention_bias") or hf.get("mlp_bias"):
            raise ConfigError("Llama configs with biases are not supported")
        if hf.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act {hf.get('hidden_act')!r} is not supported (only silu)")
        # The figures the arithmetic below uses ("128" as text was "head_dim × num_attention_heads must equal
        # hidden_size"); the config's own checks see the rest.
        for key in ("num_attention_heads", "hidden_size", "head_dim"):
            value = hf.get(key, 1) if key == "head_dim" else hf[key]
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise ConfigError(f"{key} must be a positive integer, got {value!r}")
        heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
        if head_dim * heads != hf["hidden_size"]:
            raise ConfigError("head_dim × num_attention_heads must equal hidden_size")
        # transformers ≥ 5 reads it from rope_parameters, before the top level where older releases keep it.
        rope_theta = (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta"))
        if rope_theta is None:
            rope_theta = 10_000.0
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            intermediate_size=hf["intermediate_size"],
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            # As written (null: Llama's default), checked by the config: bool("no") is True.
            tie_word_embeddings=False if hf.get("tie_word_embeddings") is None else hf["tie_word_embeddings"],
            initializer_range=hf.get("initializer_range", 0.02),
        )


MAX_SAMPLE_TOKENS = 10_000
"""The most tokens a sample during training generates."""

MIN_VOCAB_SIZE = 300
"""The smallest vocabulary a tokenizer is trained to: its 256 byte tokens, the special tokens, some merges."""


@dataclass(frozen=True)
class DataConfig:
    """Where the text comes from and how it becomes samples."""

    source: str = BUILTIN_CORPUS
    """``builtin`` (Python's own documentation topics), a .txt/.md/.jsonl(.gz/.zst)/.parquet/.arrow file, a
    folder of one of these formats, a Hugging Face ``save_to_disk`` folder, or ``hf:NAME[:CONFIG[:SPLIT]]``."""
    layout: str = "packed"
    """``packed``: documents concatenated and cut into windows; ``document``: one padded document per sample."""
    seq_len: int = 128
    vocab_size: int = 2048
    """Target vocabulary of the BPE tokenizer (it may end smaller on a small corpus)."""
    val_fraction: float = 0.05
    """Share of samples held out for validation."""
    text_field: str = "text"
    """The text column of Parquet/Arrow files and Hugging Face datasets, the text key of JSONL lines."""
    tokenizer: str | None = None
    """An existing ``tokenizer.json`` to use instead of training one (``vocab_size`` is then ignored)."""
    tokenizer_train_docs: int = 100_000
    """Documents (the first ones of the corpus) a new tokenizer is trained on: its cost stays bounded."""

    def __post_init__(self) -> None:
        _check_types(self)
        _require(bool(self.text_field.strip()), "text field is empty", "text_field")
        _require(self.tokenizer is None or bool(self.tokenizer.strip()), "tokenizer path is empty", "tokenizer")
        _require(self.tokenizer_train_docs >= 1,
                 f"tokenizer training documents must be ≥ 1, got {self.tokenizer_train_docs!r}",
                 "tokenizer_train_docs")
        _require(self.layout in LAYOUTS, f"unknown layout {self.layout!r}; choose one of {', '.join(LAYOUTS)}",
                 "layout")
        _require(self.seq_len >= 2, f"sequence length (seq_len) must be an integer ≥ 2, got {self.seq_len!r}",
                 "seq_len")
        _require(MIN_VOCAB_SIZE <= self.vocab_size <= 1_000_000,
                 f"vocabulary size (vocab_size) must be between {MIN_VOCAB_SIZE} and 1,000,000, "
                 f"got {self.vocab_size!r}",
                 "vocab_size")
        _require(0.0 < self.val_fraction < 0.5, f"val_fraction must be in (0, 0.5), got {self.val_fraction!r}",
                 "val_fraction")
        _require(bool(self.source), "data source is empty", "source")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataConfig:
        return _from_dict(cls, data, "data")


@dataclass(frozen=True)
class TrainConfig:
    """Optimizer, schedule, speedups and budget."""

    micro_batch: int = 16
    """Sequences per forward/backward pass."""
    accum_steps: int = 1
    """Micro-batches per optimizer step (gradient accumulation)."""
    auto_micro_batch: bool = False
    """Before the run, lower ``micro_batch`` to the largest that fits in memory, raising ``accum_steps`` so
    their product (the effective batch per process) is unchanged (``--micro-batch auto``; ``"auto"`` in JSON)."""
    budget_kind: str = "steps"
    budget: float = 300
    """Optimizer steps, tokens or epochs, per ``budget_kind``."""
    budget_given: bool = False
    """The budget was given for this run (the command line's --steps, --tokens or --epochs), not inherited: on
    resume it is the lineage's new total even where it equals the parent's; left out, the run keeps the
    parent's horizon in tokens whatever its new batch."""
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_ratio: float = 0.05
    """Linear warmup as a share of the token budget: the same LR-vs-tokens curve for any effective batch."""
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""
    compile_mode: str = "off"
    compile_scope: str = "model"
    """``model`` compiles the whole model, ``block`` each transformer block on its own."""
    fsdp: bool = False
    """Shard parameters, gradients and optimizer state over the ranks (FSDP2) instead of replicating them (DDP)."""
    precision: str = "auto"
    """``auto``: bf16 on CUDA; on a CPU bf16 where a one-time probe measured a training pass at the model's
    shapes ≥ 1.3× faster in bf16 than in fp32, else fp32 (``core.precision``)."""
    device: str = "auto"
    seed: int = 1337
    eval_every: int = 100
    """Optimizer steps between validation passes; 0 disables (a final one still runs)."""
    eval_batches: int = 8
    sample_every: int = 0
    """Optimizer steps between generated samples; 0 means only at the end."""
    sample_tokens: int = 48
    save_every: int = 0
    """Optimizer steps between checkpoints; 0 saves only when the run ends."""
    keep: int = 3
    """How many periodic checkpoints to keep."""

    def __post_init__(self) -> None:
        _check_types(self)
        _require(self.micro_batch >= 1, f"micro-batch must be an integer ≥ 1, got {self.micro_batch!r}",
                 "micro_batch")
        _require(self.accum_steps >= 1, f"accumulation steps must be an integer ≥ 1, got {self.accum_steps!r}",
                 "accum_steps")
        _require(self.budget_kind in BUDGET_KINDS, f"unknown budget kind {self.budget_kind!r}", "budget_kind")
        _require(self.budget > 0, f"budget must be positive, got {self.budget!r}", "budget")
        _require(self.budget_kind == "epochs" or float(self.budget).is_integer(),
                 f"a budget in {self.budget_kind} must be a whole number, got {self.budget!r}", "budget")
        _require(self.lr > 0, f"learning rate must be positive, got {self.lr!r}", "lr")
        _require(0 <= self.min_lr <= self.lr, f"min-lr must be between 0 and lr ({self.lr}), got {self.min_lr!r}",
                 "min_lr")
        _require(0 <= self.warmup_ratio < 1,
                 f"warmup must be a share of the budget in [0, 1), got {self.warmup_ratio!r}", "warmup_ratio")
        _require(self.weight_decay >= 0, "weight decay must be ≥ 0", "weight_decay")
        _require(0 <= self.beta1 < 1, "Adam beta1 must be in [0, 1)", "beta1")
        _require(0 <= self.beta2 < 1, "Adam beta2 must be in [0, 1)", "beta2")
        _require(self.grad_clip >= 0, "grad clip must be ≥ 0", "grad_clip")
        _require(self.compile_mode in COMPILE_MODES,
                 f"unknown compile mode {self.compile_mode!r}; choose one of {', '.join(COMPILE_MODES)}",
                 "compile_mode")
        _require(self.compile_scope in COMPILE_SCOPES,
                 f"unknown compile scope {self.compile_scope!r}; choose one of {', '.join(COMPILE_SCOPES)}",
                 "compile_scope")
        _require(self.precision in PRECISIONS,
                 f"unknown precision {self.precision!r}; choose one of {', '.join(PRECISIONS)}", "precision")
        _require(bool(self.device), "device is empty", "device")
        _require(0 <= self.seed <= MAX_SEED, f"seed must be between 0 and 2**63 - 1, got {self.seed!r}", "seed")
        # CUDA-graph replay reuses static gradient buffers; with several backward
        # passes per optimizer step some PyTorch releases accumulate into stale
        # buffers and give wrong gradients without any error. Unproven here, so refused.
        _require(not (self.compile_mode in CUDA_GRAPH_MODES and self.accum_steps > 1),
                 f"compile mode {self.compile_mode!r} uses CUDA graphs, which can give wrong gradients with "
                 f"gradient accumulation; use 'max-autotune-no-cudagraphs' or 'default' with accumulation > 1",
                 "compile_mode")
        _require(not (self.fsdp and self.precision == "fp16"),
                 "fp16 (with its loss scaler) is not supported with FSDP; use bf16 or fp32", "precision")
        for name in ("eval_every", "sample_every", "save_every"):
            _require(getattr(self, name) >= 0, f"{name.replace('_', ' ')} must be ≥ 0", name)
        _require(self.eval_batches >= 1, "eval batches must be ≥ 1", "eval_batches")
        _require(self.keep >= 1, "keep must be ≥ 1", "keep")
        # A sample runs between two steps, deaf to Stop: bounded (1e9 tokens held a run for good).
        _require(1 <= self.sample_tokens <= MAX_SAMPLE_TOKENS,
                 f"sample tokens must be between 1 and {MAX_SAMPLE_TOKENS:,} (a glimpse of the model's text; "
                 f"speedboard generate writes more), got {self.sample_tokens!r}", "sample_tokens")

    def sequences_per_step(self, world_size: int = 1) -> int:
        """Effective batch in sequences per optimizer step."""
        return self.micro_batch * self.accum_steps * world_size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        return _from_dict(cls, data, "train")


@dataclass(frozen=True)
class Preset:
    model: ModelConfig
    seq_len: int
    vocab_size: int
    micro_batch: int
    lr: float
    steps: int


PRESETS: dict[str, Preset] = {
    # ~1.3M parameters: loss falls visibly within a minute on two CPU cores.
    "tiny": Preset(ModelConfig(vocab_size=2048, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
                               intermediate_size=384, max_position_embeddings=256),
                   seq_len=128, vocab_size=2048, micro_batch=16, lr=3e-3, steps=1000),
    # ~25M parameters.
    "small": Preset(ModelConfig(vocab_size=8192, hidden_size=512, num_layers=6, num_heads=8, num_kv_heads=2,
                                intermediate_size=1408, max_position_embeddings=1024),
                    seq_len=256, vocab_size=8192, micro_batch=8, lr=1e-3, steps=500),
    # The reference configuration of the article series (179M parameters at 50k vocabulary, embeddings untied).
    "base": Preset(ModelConfig(vocab_size=50_000, hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=3,
                               intermediate_size=3072, max_position_embeddings=2048),
                   seq_len=1024, vocab_size=50_000, micro_batch=8, lr=6e-4, steps=2000),
}


def preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs; the unit the CLI and the GUI hand to the trainer."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    preset: str = "tiny"
    out_dir: str | None = None
    """Folder that holds run folders; ``None`` is the per-user data folder."""
    resume: str | None = None
    """Checkpoint to continue exactly (weights, optimizer, schedule, data position)."""
    init_from: str | None = None
    """Checkpoint or weights file to start from with a fresh optimizer."""
    parent: str | None = None
    """Run id this run continues, for plots that join a lineage."""
    name: str | None = None

    def __post_init__(self) -> None:
        _check_types(self)
        _require(self.data.seq_len <= self.model.max_position_embeddings,
                 f"sequence length {self.data.seq_len} is beyond the model's "
                 f"{self.model.max_position_embeddings} positions", "seq_len")
        _require(not (self.resume and self.init_from), "use either resume or init-from, not both", "init_from")
        for name in ("out_dir", "resume", "init_from"):  # "" would mean the current folder, or quietly nothing
            value = getattr(self, name)
            _require(value is None or bool(value.strip()), f"{name.replace('_', ' ')} path is empty; leave it out "
                     f"(null) instead", name)
        self.check_tokens_per_step()

    def check_tokens_per_step(self, world_size: int = 1) -> None:
        """The tokens of an optimizer step of ``world_size`` processes fit the 64-bit counters (a ConfigError)."""
        tokens = self.tokens_per_step(world_size)
        processes = f"{world_size} processes × " if world_size > 1 else ""
        fewer = " or fewer processes" if world_size > 1 else ""
        _require(tokens <= MAX_COUNT, f"{tokens:,} tokens per optimizer step (micro-batch × accumulation × "
                 f"{processes}sequence length): counts beyond 2**63 - 1 do not fit the 64-bit counters; give a "
                 f"smaller batch{fewer}", "micro_batch")

    def tokens_per_step(self, world_size: int = 1) -> int:
        """Token positions per optimizer step (the effective batch in tokens)."""
        return self.train.sequences_per_step(world_size) * self.data.seq_len

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.to_dict(),
            "data": self.data.to_dict(),
            "train": self.train.to_dict(),
            "preset": self.preset,
            "out_dir": self.out_dir,
            "resume": self.resume,
            "init_from": self.init_from,
            "parent": self.parent,
            "name": self.name,
        }

    @classmethod
    def from_dict(cls, data: Any, *, strict: bool = False) -> RunConfig:
        """The inverse of ``to_dict``; any other JSON shape is a ConfigError naming the bad part.

        ``strict`` (a file a user wrote): a key that names no setting is a ConfigError too.

        A file without a ``model`` section takes the named preset (``"preset": "small"``)
        as its base: its model, sequence length, vocabulary, micro-batch, learning rate
        and budget; its own ``data``/``train`` keys override those. With a ``model``
        section, ``preset`` is only a label.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"a run configuration must be a JSON object, got {type(data).__name__}")
        if strict:
            _refuse_unknown(data, {"model", "data", "train", "preset", *_RUN_FIELDS}, "the configuration")
        sections = {}
        for name in ("model", "data", "train"):
            section = data.get(name, {})
            if not isinstance(section, dict):
                raise ConfigError(f"the {name} section must be a JSON object, got {type(section).__name__}", name)
            sections[name] = section
        train = sections["train"]
        mb = train.get("micro_batch")
        if isinstance(mb, str) and mb.strip().lower() == "auto":  # the preset's micro-batch, lowered to what fits
            # "auto" is the request, whatever "auto_micro_batch" says: every run's config.json records it false,
            # and setting "micro_batch" to "auto" there (the README's way) was refused as a contradiction.
            train = sections["train"] = {**{k: v for k, v in train.items() if k != "micro_batch"},
                                         "auto_micro_batch": True}
        if "lr" in train and "min_lr" not in train and isinstance(train["lr"], (int, float)):
            sections["train"] = {**train, "min_lr": train["lr"] / 10}  # as the --lr flag does
        name = data.get("preset", "tiny")
        if not isinstance(name, str):
            raise ConfigError(f"preset must be text, got {name!r}", "preset")
        if "model" not in data:  # the preset named, or tiny, the label the run gets: its budget too, not 300 steps
            base = config_from_preset(name)  # an unknown name is one line here
            sections = {"model": base.model.to_dict(), "data": {**base.data.to_dict(), **sections["data"]},
                        "train": {**base.train.to_dict(), **sections["train"]}}
        return cls(
            model=_from_dict(ModelConfig, sections["model"], "model", strict=strict),
            data=_from_dict(DataConfig, sections["data"], "data", strict=strict),
            train=_from_dict(TrainConfig, sections["train"], "train", strict=strict),
            **{k: data.get(k) for k in _RUN_FIELDS},
            preset=name,
        )

    def expected_model(self) -> ModelConfig:
        """The model a run of this config trains, before a tokenizer or checkpoint is read: the data's
        vocabulary (a tokenizer trained for it has that size); a checkpoint's run keeps the model as
        configured (its architecture). For estimates that cannot read them (the precision probe's shapes,
        memory, in a planner or the dashboard); a run uses the real one."""
        if self.resume or self.init_from or self.data.tokenizer:
            return self.model
        return dataclasses.replace(self.model, vocab_size=self.data.vocab_size)

    def replace(self, **sections: Any) -> RunConfig:
        """Copy with whole sections or per-section overrides: ``replace(train={"accum_steps": 4})``."""
        changes: dict[str, Any] = {}
        for key, value in sections.items():
            current = getattr(self, key)
            if isinstance(value, dict) and dataclasses.is_dataclass(current):
                changes[key] = dataclasses.replace(current, **value)
            else:
                changes[key] = value
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class GenerationConfig:
    """How ``speedboard generate`` samples: checked before any checkpoint is read."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    """0 is greedy (the most likely token each time)."""
    top_k: int | None = None
    """Sample among the k most likely tokens only; None samples among all."""
    seed: int = 0

    def __post_init__(self) -> None:
        _check_types(self)
        _require(self.max_new_tokens >= 1, f"max new tokens must be ≥ 1, got {self.max_new_tokens!r}",
                 "max_new_tokens")
        _require(self.temperature >= 0, f"temperature must be ≥ 0 (0 is greedy), got {self.temperature!r}",
                 "temperature")
        _require(self.top_k is None or self.top_k >= 1, f"top-k must be ≥ 1, got {self.top_k!r}", "top_k")
        # Greedy decoding takes the most likely token whatever top-k says: a top-k given with it was taken and
        # did nothing (transformers warns of the same with do_sample=False).
        _require(self.top_k is None or self.temperature > 0, "top-k chooses among the most likely tokens when "
                 "sampling: give a temperature > 0 with it (0, the default, is greedy)", "top_k")
        _require(0 <= self.seed <= MAX_SEED, f"seed must be between 0 and 2**63 - 1, got {self.seed!r}", "seed")


def config_from_preset(name: str = "tiny", **overrides: Any) -> RunConfig:
    """A RunConfig for a preset, with ``model=``, ``data=``, ``train=`` dict overrides."""
    p = preset(name)
    base = RunConfig(
        model=p.model,
        data=DataConfig(seq_len=p.seq_len, vocab_size=p.vocab_size),
        train=TrainConfig(micro_batch=p.micro_batch, lr=p.lr, min_lr=p.lr / 10, budget=p.steps),
        preset=name,
    )
    return base.replace(**overrides) if overrides else base
