"""Byte-level BPE tokenizer trained with Hugging Face ``tokenizers``.

A tokenizer is trained on the run's own corpus, cached by the corpus' hash and
target size, and saved into every run folder and checkpoint as
``tokenizer.json`` so a model never travels without it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from core.errors import CheckpointError, ConfigError, DataError
from core.json_text import parse_json
from core.paths import unnameable, user_path

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
SPECIAL_TOKENS = (PAD, BOS, EOS)  # ids 0, 1, 2 in every trained tokenizer
TOKENIZER_FILE = "tokenizer.json"  # its name in a checkpoint and in a Hugging Face folder
MAX_TRAINING_RUN = 100
"""Characters without a space that a tokenizer's training sees as one run at most (see ``train_bpe``)."""
# Names other tokenizers (e.g. Hugging Face Llama folders) give the same roles.
# The article series' tokenizers name them [BOT]/[EOT]/[PAD]; others [BOS]/[EOS] or <bos>/<eos>.
_ALIASES = {"bos": (BOS, "<s>", "<|begin_of_text|>", "[BOT]", "[BOS]", "<bos>", "<|startoftext|>", "<|bos|>"),
            "eos": (EOS, "</s>", "<|end_of_text|>", "<|endoftext|>", "[EOT]", "[EOS]", "<eos>", "<|eos|>"),
            "pad": (PAD, "<pad>", "<|finetune_right_pad_id|>", "[PAD]", "<|padding|>", "<|pad|>")}


CACHE_ROOM = 200
"""Bytes of the paths kept below the cache folder at most (``stores/<key>.tmp-…/offsets.bin``)."""


def cache_dir() -> Path:
    """Per-user cache folder (``SPEEDBOARD_CACHE_DIR`` overrides it, read as every path the user gives:
    ``~`` expanded, made absolute)."""
    env = os.environ.get("SPEEDBOARD_CACHE_DIR")
    if env:
        path = user_path(env)
        if (why := unnameable(path, room=CACHE_ROOM)) is not None:  # else a traceback from the first stat below it
            raise DataError(f"SPEEDBOARD_CACHE_DIR cannot hold the cache ({why}); set it to a shorter path")
        return path
    import platformdirs

    return Path(platformdirs.user_cache_dir("speedboard"))


def _why_not_a_tokenizer(text: str, exc: Exception) -> str:
    """Why ``text`` is no tokenizer.json, in words: JSON of another shape is said as such, where the library's
    own message ("expected `,` or `}` at line 1 column 5" for ``{"a":1}``) names a place in valid JSON."""
    try:
        value = json.loads(text)
    except ValueError:
        return f"it is not JSON ({str(exc).splitlines()[0]})"
    if not isinstance(value, dict):
        return f"it holds a JSON {type(value).__name__}, not a tokenizer's object"
    if "model" not in value:
        keys = ", ".join(list(value)[:5]) or "none"
        return f"it is JSON without a tokenizer's \"model\" (its keys: {keys})"
    return str(exc).splitlines()[0]


MAX_TOKEN_ID = (1 << 22) - 1
"""The highest token id a tokenizer file may use (4,194,303): the largest vocabularies in use hold about 256k
tokens, and every id up to the highest needs an embedding row. A file with one id of four billion (a damaged
or hand-edited file) was tokenized for minutes and gigabytes before the model it asked for was refused."""
NOT_A_TOKENIZER = "tokenizer_file"
"""The ``field`` of a CheckpointError for a file that cannot be read as a tokenizer at all."""


class BPETokenizer:
    """A thin wrapper that knows the special tokens' ids."""

    def __init__(self, tok: Tokenizer, bos: str | None = None, eos: str | None = None, pad: str | None = None) -> None:
        self.tok = tok
        vocab = tok.get_vocab(with_added_tokens=True)
        added = tok.get_added_tokens_decoder()
        # A role's usual names are looked for among the tokens marked special first, then the other added tokens,
        # then the whole vocabulary: a BPE that learned "<s>" as a piece of text (an HTML strike-through tag)
        # beside its special [BOT] took the piece for BOS, and documents began with visible text.
        tables = ({t.content: i for i, t in added.items() if t.special}, {t.content: i for i, t in added.items()},
                  vocab)

        def find(role: str, name: str | None) -> int | None:
            if name:  # named in a tokenizer_config.json (``load`` refuses a name the vocabulary lacks)
                return vocab.get(name)
            return next((table[c] for table in tables for c in _ALIASES[role] if c in table), None)

        self.bos_id = find("bos", bos)
        self.eos_id = find("eos", eos)
        self.pad_id = find("pad", pad)
        if self.bos_id is None:
            # GPT-2-style vocabularies have one <|endoftext|> that opens and closes documents.
            self.bos_id = self.eos_id
        names = {v: k for k, v in vocab.items()}
        self.bos_token = names.get(self.bos_id) if self.bos_id is not None else None
        self.eos_token = names.get(self.eos_id) if self.eos_id is not None else None
        self.pad_token = names.get(self.pad_id) if self.pad_id is not None else None
        # Highest id + 1, not the number of entries: a vocabulary with holes (ids 2..N) still needs an
        # embedding row for its top id, and the token store a dtype that holds it.
        self._vocab_size = max(vocab.values(), default=-1) + 1

    @property
    def vocab_size(self) -> int:
        """Embedding rows the tokenizer needs: its highest token id + 1."""
        return self._vocab_size

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of ``ids``; ``skip_special`` leaves out the special tokens and the BOS, EOS and PAD the engine
        places, also where the tokenizer does not mark them special (they showed as "[BOT]Hello")."""
        ids = list(ids)
        if skip_special:
            roles = {self.bos_id, self.eos_id, self.pad_id} - {None}
            ids = [i for i in ids if i not in roles]
        return self.tok.decode(ids, skip_special_tokens=skip_special)

    def to_str(self) -> str:
        return self.tok.to_str()

    def save(self, folder: str | Path, for_hf: bool = False, max_length: int | None = None) -> Path:
        """Write ``tokenizer.json`` (and the HF ``tokenizer_config.json``) into ``folder``.

        ``for_hf``: as a Hugging Face model's tokenizer, which puts BOS before a text itself (every training
        sample here begins with one): a post-processor adds it, so ``AutoTokenizer(text)`` gives the ids the
        model was trained on. Speedboard's own files leave it out: the engine adds BOS and EOS itself.
        ``max_length``: the model's positions, as ``model_max_length`` (without it, transformers' truncation and
        its too-long warning took a length of 1e30).
        """
        folder = Path(folder)
        path = folder / TOKENIZER_FILE
        adds_bos = for_hf and self.bos_token is not None
        path.write_text(self._with_bos().to_str() if adds_bos else self.to_str(), encoding="utf-8")
        config = self.hf_config(add_bos=adds_bos)
        if max_length is not None:
            config["model_max_length"] = max_length
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        return path

    def _with_bos(self) -> Tokenizer:
        from tokenizers.processors import ByteLevel, Sequence, TemplateProcessing

        tok, bos = Tokenizer.from_str(self.to_str()), self.bos_token  # a copy: this tokenizer stays as it is
        template = TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1",
                                      special_tokens=[(bos, self.bos_id)])
        # The file's own post-processor goes: a BERT template put [CLS] … [SEP] around a text trained as [BOT] ….
        # A byte-level one stays (it only trims offsets).
        kept = tok.post_processor if isinstance(tok.post_processor, ByteLevel) else None
        tok.post_processor = Sequence([kept, template]) if kept is not None else template
        return tok

    def hf_config(self, add_bos: bool = False) -> dict:
        # split_special_tokens: a special token's name in text is text, as training and generate read it
        # (``plain_text_tokenizer``); Hugging Face otherwise made "<|eos|>" in a document the EOS token.
        cfg: dict = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                     "add_bos_token": add_bos, "add_eos_token": False, "split_special_tokens": True}
        for role in ("bos", "eos", "pad"):
            token = getattr(self, f"{role}_token")
            if token is not None:
                cfg[f"{role}_token"] = token
        return cfg

    @classmethod
    def load(cls, path: str | Path) -> BPETokenizer:
        """Load ``tokenizer.json`` (a file, or a folder holding it with an optional tokenizer_config.json)."""
        path = Path(path)
        folder = path if path.is_dir() else path.parent
        file = path / TOKENIZER_FILE if path.is_dir() else path
        try:
            # Read here, parsed from the text: tokenizers' from_file takes a str path, which cannot hold a
            # folder name that is not UTF-8 (a run saved under one could never be read back). An OSError (a
            # checkpoint rotated away while it is read) goes to the caller as it is.
            text = file.read_text(encoding="utf-8-sig")  # a byte order mark (Windows' editors) is no JSON
        except UnicodeDecodeError:
            raise CheckpointError(f"cannot read tokenizer {file}: it is not UTF-8 text", NOT_A_TOKENIZER) from None
        try:
            tok = Tokenizer.from_str(text)
        except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
            raise CheckpointError(f"cannot read tokenizer {file}: {_why_not_a_tokenizer(text, exc)}",
                                  NOT_A_TOKENIZER) from None
        ids = tok.get_vocab(with_added_tokens=True)
        top = max(ids.values(), default=-1)
        if top > MAX_TOKEN_ID:
            raise CheckpointError(f"cannot use tokenizer {file}: its highest token id is {top:,} (for "
                                  f"{len(ids):,} tokens), and a model needs an embedding row for every id up to "
                                  f"it; token ids end at {MAX_TOKEN_ID:,} here")
        special: dict[str, str | None] = {}
        cfg_file = folder / "tokenizer_config.json"
        if cfg_file.is_file():
            try:
                cfg = parse_json(cfg_file.read_text(encoding="utf-8-sig"))
            except (OSError, ValueError) as exc:  # named roles that cannot be read are not guessed at
                raise CheckpointError(f"cannot read {cfg_file}: {getattr(exc, 'strerror', None) or exc}",
                                      "tokenizer_config") from None
            if not isinstance(cfg, dict):
                raise CheckpointError(f"{cfg_file} holds no object of settings", "tokenizer_config")
            for role in ("bos", "eos", "pad"):
                value = cfg.get(f"{role}_token")
                name = value.get("content") if isinstance(value, dict) else value
                if name is not None and (not isinstance(name, str) or name not in ids):
                    # Named, so not guessed from the usual names: "<|im_start|>" absent gave [BOT] without a word.
                    raise CheckpointError(f"{cfg_file} names {name!r} as its {role}_token, which {file.name} does "
                                          f"not hold", "tokenizer_config")
                special[role] = name
        return cls(tok, **special)


LONG_DOCUMENT_CHARS = 1 << 20
"""A document longer than this is encoded (and trains a tokenizer) in pieces, made one at a time: encoded whole, a
text without blank lines (one document) took memory in proportion to its length, 1.9 GB for 98 MB."""
PIECE_CHARS = 1 << 17
"""A piece's length at most, and half of it at least where a cut keeps the ids (``iter_pieces``): what one Rust
thread encodes at a time, whose working memory grows with it."""
# Where a cut gives the ids of the whole text. Before a space between two non-spaces ("a| b"): the pre-tokenizers
# of GPT-2/ByteLevel (with or without add_prefix_space), Llama 3, BERT, Whitespace and Metaspace all end a word
# there and start the next with that space, and a piece that starts with a space gets no prefix space. After a
# line break between two non-spaces ("a\n|b"): the same for those without a prefix space (one would be added to
# "b"). Not after a line break before indentation: ByteLevel's "\s+(?!\S)" joins "\n" with the spaces after it.
# No cut is exact for a normalizer that prepends to every text (Prepend, in Llama 2's and Mistral's tokenizer.json),
# nor where nothing splits at spaces and the vocabulary holds a token across one (Metaspace with split=False).
_EXACT_CUTS = (re.compile(r"(?<=\S)(?= \S)"), re.compile(r"(?<=\S\n)(?=\S)"))
_SEARCH_BLOCK = 1 << 12


def _last_match(pattern: re.Pattern, doc: str, lo: int, hi: int) -> int:
    """The last position in ``[lo, hi]`` where the zero-width ``pattern`` matches, or -1; searched backwards a
    block at a time (the cut is nearly always within the last few characters), each block twice the last."""
    block = _SEARCH_BLOCK
    while hi >= lo:
        a = max(lo, hi - block)
        last = -1
        # Two characters past hi: the patterns look ahead that far.
        for m in pattern.finditer(doc, a, min(hi + 2, len(doc))):
            if m.start() > hi:
                break
            last = m.start()
        if last >= 0:
            return last
        hi, block = a - 1, block * 2
    return -1


def piece_end(doc: str, start: int, end: int) -> int:
    """Where to end the piece of ``doc`` that starts at ``start``, at ``end`` at most (``start < end``).

    One of ``_EXACT_CUTS`` in the piece's second half where there is one, so that encoding the pieces gives the
    ids of the whole text (see ``_EXACT_CUTS`` for which tokenizers); else, in a text without such a place (a
    base64 blob, Chinese without spaces), after the last line break, else after the last space, else at
    ``end``, which changes an id or two at that cut."""
    for pattern in _EXACT_CUTS:
        cut = _last_match(pattern, doc, start + (end - start) // 2, end)
        if cut > start:
            return cut
    cut = doc.rfind("\n", start + 1, end)
    if cut < 0:
        cut = doc.rfind(" ", start + 1, end)
    return cut + 1 if cut >= 0 else end


def iter_pieces(doc: str) -> Iterator[str]:
    """``doc`` whole, or when longer than ``LONG_DOCUMENT_CHARS`` in pieces of at most ``PIECE_CHARS``, made one at
    a time (a long document is not copied whole), each ended by ``piece_end``."""
    if len(doc) <= LONG_DOCUMENT_CHARS:
        yield doc
        return
    start = 0
    while len(doc) - start > PIECE_CHARS:
        cut = piece_end(doc, start, start + PIECE_CHARS)
        yield doc[start:cut]
        start = cut
    yield doc[start:]


_LONG_RUN = re.compile(rf"\S{{{MAX_TRAINING_RUN + 1},}}")


def _short_runs(text: str) -> str:
    """``text`` with runs of non-space characters longer than ``MAX_TRAINING_RUN`` cut into pieces that long."""
    def cut(m: re.Match) -> str:
        run = m.group()
        return " ".join(run[i:i + MAX_TRAINING_RUN] for i in range(0, len(run), MAX_TRAINING_RUN))

    return _LONG_RUN.sub(cut, text)


def train_bpe(documents: Sequence[str], vocab_size: int) -> BPETokenizer:
    # BPE training costs more than linearly in a word's length: one 2 MB run without a space (a base64 blob
    # in a scraped page) kept it busy for over ten minutes. No merge worth learning is that long.
    # A long document (a text without blank lines) trains in pieces too: whole, 18 MB of it took 1.9 GB. The
    # pieces are made as training reads them: the sample is not held twice.
    pieces = (piece for d in documents for piece in iter_pieces(_short_runs(d)))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(pieces, trainer=trainer, length=len(documents))
    return BPETokenizer(tok)


def load_tokenizer_file(path: str | Path) -> BPETokenizer:
    """A user's ``tokenizer.json`` (or a folder holding one), for ``--tokenizer`` in train, prepare and generate.

    Its special tokens come from a ``tokenizer_config.json`` beside it, or else
    from their usual names (the article series' ``[BOT]``/``[EOT]``/``[PAD]``
    included); one without an end-of-text token cannot end documents and is refused.
    """
    p = user_path(path)
    try:
        st = p.stat()
    except OSError:
        raise DataError(f"tokenizer file {path} does not exist", "tokenizer") from None
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise DataError(f"tokenizer {path} is not a regular file", "tokenizer")
    if stat.S_ISDIR(st.st_mode) and not (p / TOKENIZER_FILE).is_file():
        raise DataError(f"tokenizer folder {path} holds no {TOKENIZER_FILE}", "tokenizer")
    try:
        tok = BPETokenizer.load(p)
    except CheckpointError as exc:
        # Asked only of a file that could not be read as one: a tokenizer whose ids go too far is one.
        hint = " (is it a Hugging Face tokenizer.json?)" if exc.field == NOT_A_TOKENIZER else ""
        raise DataError(f"{exc}{hint}", "tokenizer") from None
    except OSError as exc:  # unreadable (permissions), or gone since it was looked at
        raise DataError(f"cannot read tokenizer {path}: {exc.strerror or exc}", "tokenizer") from None
    check_special_tokens(tok, str(path))
    return tok


def check_special_tokens(tok: BPETokenizer, origin: str) -> None:
    """Every sample ends documents with an end-of-text token: a tokenizer without one cannot be used."""
    if tok.eos_id is None:
        names = ", ".join(dict.fromkeys(_ALIASES["eos"]))  # each name once
        raise DataError(f"tokenizer {origin} has no end-of-text token (looked for {names})", "tokenizer")


def _has_byte_level(part: object) -> bool:
    """Whether a tokenizer.json component (a pre-tokenizer, a normalizer, a Sequence of them) holds ByteLevel."""
    if isinstance(part, dict):
        return part.get("type") == "ByteLevel" or any(_has_byte_level(v) for v in part.values())
    return isinstance(part, list) and any(_has_byte_level(v) for v in part)


def drops_unknown_text(tok: BPETokenizer) -> bool:
    """Whether ``tok`` leaves text out of its ids without a word: a BPE model without an unknown token or byte
    fallback drops every character it has no token for, unless it is byte-level with all 256 bytes in its
    vocabulary (Speedboard's own, GPT-2's). Read from its tokenizer.json: no text is encoded."""
    spec = json.loads(tok.to_str())
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("unk_token") is not None or model.get("byte_fallback"):
        return False
    if _has_byte_level(spec.get("pre_tokenizer")) or _has_byte_level(spec.get("normalizer")):
        return not set(pre_tokenizers.ByteLevel.alphabet()) <= tok.tok.get_vocab().keys()
    return True


def dropped_characters(tok: Tokenizer, text: str) -> list[str]:
    """The characters of ``text`` that a tokenizer which drops unknown text (``drops_unknown_text``) leaves out,
    each once: those that, encoded alone, do not come back decoded (as its normalizer writes them; a Metaspace
    tokenizer keeps its word marker of a dropped one). Told character by character, as the offsets of what is
    kept cannot tell it: after a dropped character, tokenizers gives the kept tokens the offsets of the
    characters before them ('The' with no 'T': 'h' at 0-1, 'e' at 1-2, and 'e' was named as dropped)."""
    dropped = []
    for c in dict.fromkeys(text):
        if c.isspace():
            continue
        ids = tok.encode(c, add_special_tokens=False).ids
        written = (tok.normalizer.normalize_str(c) if tok.normalizer is not None else c).strip()
        if not ids or written not in tok.decode(ids, skip_special_tokens=False):
            dropped.append(c)
    return dropped


def _without_post_processor(tok: BPETokenizer) -> dict:
    spec = json.loads(tok.to_str())
    spec.pop("post_processor", None)
    return spec


def require_checkpoint_tokenizer(path: str, own: BPETokenizer, source: str) -> None:
    """A tokenizer file given beside a checkpoint that has its own must be that one: its weights learned its
    ids (train --resume/--init-from, generate). A copy is accepted, also one that adds BOS in a post-processor
    (``speedboard export``'s, for Hugging Face): Speedboard encodes without it and places BOS itself."""
    if _without_post_processor(load_tokenizer_file(path)) != _without_post_processor(own):
        raise ConfigError(f"tokenizer {path} is not the one of {source}, whose weights learned its token ids; "
                          f"leave --tokenizer out to use the checkpoint's", "tokenizer")
