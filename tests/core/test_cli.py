"""The headless CLI end to end, and one clear line for every bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.cli import main

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--preset", "tiny", "--micro-batch", "2", "--seq-len", "32", "--vocab-size", "512", "--eval-every", "2",
         "--no-progress", "--log-every", "1"]


def run_cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "core.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_train_then_generate_end_to_end(tmp_path):
    out = run_cli("train", *SMALL, "--steps", "3", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "step      3 | loss" in out.stdout and "finished at step 3" in out.stdout
    (run_dir,) = tmp_path.iterdir()
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x["event"] == "step"] == [1, 2, 3]
    assert lines[-1]["event"] == "finished"
    # The finish line's memory is the training's own, as the dashboard and the bench report it; on a CPU
    # the process's resident set (Python, torch) is named beside it.
    started, finished = next(x for x in lines if x["event"] == "run_started"), lines[-1]
    assert finished["train_mem_gib"] == pytest.approx(finished["peak_mem_gib"] - started["mem_baseline_gib"])
    assert f"peak mem {finished['train_mem_gib']:.2f} GiB for training ({finished['peak_mem_gib']:.2f} GiB the " \
           f"process)" in out.stdout
    step3 = next(x for x in lines if x["event"] == "step" and x["step"] == 3)  # the step lines say the same
    assert f"| mem {step3['peak_mem_gib'] - started['mem_baseline_gib']:.2f} GiB" in out.stdout
    gen = run_cli("generate", str(run_dir), "--prompt", "The", "--max-new-tokens", "5")
    assert gen.returncode == 0, gen.stderr
    assert gen.stdout.startswith("The")


@pytest.fixture(scope="module")
def existing_run(tmp_path_factory):
    """One finished run that every bad invocation below must leave exactly as it is."""
    out_dir = tmp_path_factory.mktemp("out")
    assert main(["train", *SMALL, "--steps", "1", "--out", str(out_dir)]) == 0
    (run_dir,) = out_dir.iterdir()
    snapshot = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    return out_dir, run_dir, snapshot


def bad_corpus(tmp_path: Path, kind: str) -> str:
    path = tmp_path / "corpus.txt"
    if kind == "empty":
        path.write_text("")
    elif kind == "latin1":
        path.write_bytes(b"caf\xe9 au lait\n" * 50)
    elif kind == "short":
        path.write_text("only a handful of words")
    return str(path)


@pytest.mark.parametrize("args, message", [
    (["--data", "{tmp}/missing.txt"], "does not exist"),
    (["--data", "empty"], "is empty"),
    (["--data", "latin1"], "not UTF-8"),
    (["--data", "short"], "fewer than one sample"),
    (["--seq-len", "4096"], "beyond the model's"),
    (["--seq-len", "1"], "sequence length (seq_len) must be an integer ≥ 2"),
    (["--vocab-size", "3"], "vocabulary size (vocab_size) must be between 300 and 1,000,000"),
    (["--accum", "0"], "accumulation steps must be"),
    (["--micro-batch", "0"], "micro-batch must be"),
    (["--compile", "turbo"], "invalid choice"),
    (["--preset", "huge"], "invalid choice"),
    (["--precision", "fp8"], "invalid choice"),
    (["--device", "cuda"], "no CUDA device"),
    (["--lr", "-1"], "learning rate must be positive"),
    # Negative numbers in any notation are values, not flags (argparse's own took "-1e-3" for one).
    (["--lr", "-1e-3"], "learning rate must be positive, got -0.001"),
    (["--min-lr", "-1E-5"], "min-lr must be between 0 and lr"),
    (["--lr", "-inf"], "lr must be a finite number, got -inf"),
    (["--compile", "reduce-overhead", "--accum", "2"], "max-autotune-no-cudagraphs"),
    # Every number is range-checked before anything is created: seeds, non-finite floats, CLI-only settings.
    (["--seed", "-1"], "seed must be between 0 and 2**63 - 1"),
    (["--seed", "18446744073709551616"], "seed must be between 0 and 2**63 - 1"),
    (["--lr", "inf"], "lr must be a finite number"),
    (["--warmup", "nan"], "warmup ratio must be a finite number"),
    (["--log-every", "0"], "--log-every: must be an integer from 1 to 2**63 - 1, got 0"),
    (["--log-every", "-3"], "--log-every: must be an integer from 1 to 2**63 - 1, got -3"),
    (["--log-every", str(2**64)], "--log-every: must be an integer from 1 to 2**63 - 1, got 18446744073709551616"),
    (["--run-id", ""], "run id '' must be a plain folder name"),  # an unset variable: not a new id
    (["--run-id", "../up"], "run id '../up' must be a plain folder name"),
    (["--run-id", "y" * 200], "run id 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy'… has 200 characters; at most 128"),
    # Huge integers: beyond 64 bits, or counts made of them beyond it, or a memory check that must stay quick.
    (["--micro-batch", "99999999999999999999999"], "micro batch must be at most 2**63 - 1"),
    (["--eval-every", "99999999999999999999999"], "eval every must be at most 2**63 - 1"),
    (["--steps", "99999999999999999999999"], "do not fit the 64-bit counters"),
    (["--accum", "999999999999999999"], "do not fit the 64-bit counters"),
    (["--micro-batch", "1000000000000"], "fits with the same effective batch"),
    (["--micro-batch", str(2**62), "--accum", "4"], "tokens per optimizer step (micro-batch × accumulation × "
                                                     "sequence length): counts beyond 2**63 - 1"),
])
def test_bad_input_is_one_line_exit_2_and_touches_nothing(existing_run, capsys, args, message):
    out_dir, run_dir, snapshot = existing_run
    capsys.readouterr()
    args = [bad_corpus(out_dir.parent, a) if a in ("empty", "latin1", "short") else a.format(tmp=out_dir)
            for a in args]
    base = [a for a in SMALL if a not in ("--seq-len", "32")] if "--seq-len" in args else SMALL
    try:
        code = main(["train", *base, "--steps", "1", "--out", str(out_dir), *args])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    assert list(out_dir.iterdir()) == [run_dir]  # no new run folder
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == snapshot


@pytest.mark.parametrize("args, message", [
    (["--init-from", "{run}", "--preset", "small"], "brings its own architecture, not the small preset's"),
    (["--resume", "{run}", "--preset", "small"], "brings its own architecture, not the small preset's"),
    (["--resume", "{run}", "--vocab-size", "4096"], "--vocab-size is for training a new tokenizer, but this run "
                                                    "uses the tokenizer of"),
    (["--init-from", "{run}", "--tokenizer-docs", "10"], "--tokenizer-docs is for training a new tokenizer"),
    (["--tokenizer", "{run}/tokenizer.json", "--vocab-size", "600"], "but this run uses the tokenizer "),
])
def test_flags_a_start_checkpoint_or_tokenizer_makes_void_are_refused(existing_run, capsys, args, message):
    """Not recorded in config.json and ignored (a tiny model once trained as "small", vocab_size 4096 was
    recorded beside a 512-token tokenizer)."""
    out_dir, run_dir, snapshot = existing_run
    capsys.readouterr()
    args = [a.format(run=run_dir) for a in args]
    assert main(["train", "--steps", "2", "--no-progress", "--out", str(out_dir), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert list(out_dir.iterdir()) == [run_dir]
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == snapshot


def test_a_config_files_model_beside_a_checkpoint_with_its_own_is_refused(existing_run, capsys, tmp_path):
    """--init-from with --config trained the checkpoint's architecture and recorded it, the config's model
    (hidden size 512, 8 layers) ignored without a word, where --preset for another architecture was refused."""
    out_dir, run_dir, snapshot = existing_run
    saved = json.loads((run_dir / "config.json").read_text())["config"]
    other = tmp_path / "other_model.json"
    other.write_text(json.dumps({**saved, "model": {**saved["model"], "hidden_size": 512, "num_layers": 8}}))
    capsys.readouterr()
    assert main(["train", "--steps", "2", "--out", str(out_dir), "--init-from", str(run_dir),
                 "--config", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"brings its own architecture, not the model of {other}; remove its \"model\" section (it "
                        f"is for a bare state dict) or start from scratch") and len(err.splitlines()) == 1, err
    assert list(out_dir.iterdir()) == [run_dir]
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == snapshot
    # The run's own configuration (its model the checkpoint's) is no contradiction.
    assert main(["train", "--steps", "2", "--out", str(tmp_path / "runs"), "--init-from", str(run_dir),
                 "--config", str(run_dir / "config.json")]) == 0


def test_python_m_speedboard_is_not_hidden_by_a_folder_of_the_users_own_named_core(tmp_path):
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "__init__.py").write_text("raise SystemExit('the user core was imported')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-m", "speedboard", "train", "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0 and "--micro-batch" in done.stdout, done.stderr


def test_bf16_on_a_device_without_it(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr("core.device.bf16_supported", lambda device: False)
    assert main(["train", *SMALL, "--steps", "1", "--precision", "bf16", "--out", str(tmp_path)]) == 2
    assert "bf16 is not supported" in capsys.readouterr().err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_bad_input_from_a_real_process_has_no_traceback(tmp_path):
    out = run_cli("train", "--data", str(tmp_path / "nope.txt"), "--out", str(tmp_path))
    assert out.returncode == 2
    assert out.stderr.strip() == f"speedboard: error: data source {tmp_path / 'nope.txt'} does not exist"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
@pytest.mark.parametrize("command", [["train", "--steps", "1"], ["generate", "{tmp}/model.pt"]])
def test_a_config_file_that_is_a_named_pipe_is_refused_not_waited_on(command, tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)  # nothing ever writes to it: reading it would block for good
    torch.save({"w": torch.zeros(1)}, tmp_path / "model.pt")
    out_flag = ["--out", str(tmp_path / "runs")] if command[0] == "train" else []
    out = run_cli(*[a.format(tmp=tmp_path) for a in command], "--config", str(fifo), *out_flag, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == f"speedboard: error: the configuration file {fifo} is not a regular file"
    assert not (tmp_path / "runs").exists()


CONFIG_FILES = {
    "model_is_a_list": ({"model": []}, "the model section must be a JSON object, got list"),
    "data_is_null": ({"data": None}, "the data section must be a JSON object, got NoneType"),
    "unknown_preset": ({"preset": "nope"}, "unknown preset 'nope'; choose one of tiny, small, base"),
    "preset_not_text": ({"preset": 3}, "preset must be text, got 3"),
    "train_value_of_a_wrong_type": ({"train": {"micro_batch": "8"}}, "micro batch must be an integer, got '8'"),
    "not_an_object": ([1, 2], "config.json does not hold a run configuration (a JSON object)"),
    # A misspelt setting would otherwise be silently ignored and the run made with the default.
    "misspelt_train_key": ({"train": {"lr": 1e-3, "acum_steps": 4}},
                           "unknown key 'acum_steps' in the train section (did you mean 'accum_steps'?)"),
    "misspelt_section": ({"preset": "tiny", "trian": {}}, "unknown key 'trian' in the configuration "
                                                          "(did you mean 'train'?)"),
    "unknown_model_key": ({"model": {"hidden": 64}}, "unknown key 'hidden' in the model section "
                                                      "(did you mean 'hidden_size'?)"),
    # "" was taken as "none" (or the current folder) for these, while an empty data or tokenizer path is refused.
    "empty_out_dir": ({"out_dir": ""}, "out dir path is empty; leave it out (null) instead"),
    "empty_resume": ({"resume": " "}, "resume path is empty; leave it out (null) instead"),
    "empty_init_from": ({"init_from": ""}, "init from path is empty; leave it out (null) instead"),
    # A run folder's config.json edited at the wrong level: the setting beside "config" was silently ignored.
    "setting_beside_a_run_folders_config": ({"run_id": "r", "config": {"preset": "tiny"}, "train": {"lr": 0.5}},
                                            "unknown key 'train' beside 'config', which holds a run folder's "
                                            "settings; move it into 'config' (or remove it)"),
}


@pytest.mark.parametrize("kind", list(CONFIG_FILES))
def test_any_config_file_shape_is_a_valid_config_or_one_line(kind, existing_run, tmp_path, capsys):
    out_dir, run_dir, snapshot = existing_run
    data, message = CONFIG_FILES[kind]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["train", "--config", str(path), "--steps", "1", "--out", str(out_dir), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("speedboard: error: ") and err.endswith(message) and "\n" not in err, err
    assert list(out_dir.iterdir()) == [run_dir]


def test_a_run_folders_own_config_json_is_a_valid_config_file(existing_run):
    from core.config import RunConfig

    _, run_dir, _ = existing_run
    recorded = json.loads((run_dir / "config.json").read_text())["config"]
    assert RunConfig.from_dict(recorded, strict=True).to_dict() == RunConfig.from_dict(recorded).to_dict()


def test_a_config_file_without_a_model_section_takes_its_presets_model():
    from core.config import PRESETS, RunConfig

    cfg = RunConfig.from_dict({"preset": "small", "train": {"lr": 1e-4}})
    small = PRESETS["small"]
    assert cfg.model == small.model and cfg.preset == "small"
    assert (cfg.data.seq_len, cfg.data.vocab_size, cfg.train.micro_batch) == (small.seq_len, small.vocab_size,
                                                                              small.micro_batch)
    assert cfg.train.lr == 1e-4 and cfg.train.min_lr == pytest.approx(1e-5)  # the file's own keys override
    # With a model section the preset is only a label: the file's model is the model.
    labelled = RunConfig.from_dict({"preset": "anything", "model": {"hidden_size": 64, "num_heads": 4,
                                                                    "num_kv_heads": 2}})
    assert labelled.model.hidden_size == 64 and labelled.preset == "anything"
    # Naming no preset, it is labelled tiny and trains tiny's budget (it trained TrainConfig's 300 steps).
    bare = RunConfig.from_dict({"train": {"accum_steps": 1}})
    assert bare.preset == "tiny" and bare.train.budget == PRESETS["tiny"].steps
    assert bare.train.micro_batch == PRESETS["tiny"].micro_batch


@pytest.mark.parametrize("args, message", [
    (["--temperature", "nan"], "temperature must be a finite number, got nan"),
    (["--temperature", "-1"], "temperature must be ≥ 0 (0 is greedy), got -1.0"),
    (["--top-k", "-1"], "top-k must be ≥ 1, got -1"),
    (["--top-k", "0"], "top-k must be ≥ 1, got 0"),
    (["--seed", str(2**70)], "seed must be between 0 and 2**63 - 1"),
    # Greedy decoding (the default temperature) ignores both: they were taken and did nothing.
    (["--top-k", "40"], "top-k chooses among the most likely tokens when sampling: give a temperature > 0 with it"),
    (["--seed", "3"], "--seed chooses the samples drawn when sampling: give --temperature > 0 with it"),
    (["--max-new-tokens", "-1"], "max new tokens must be ≥ 1, got -1"),
    (["--preset", "tiny", "--config", "{tmp}/config.json"], "--preset and --config each give a bare state dict's"),
])
def test_generate_checks_its_settings_before_reading_anything(args, message, tmp_path, capsys):
    # The checkpoint does not even exist: the settings are refused first.
    assert main(["generate", str(tmp_path / "no-such-run"), *[a.format(tmp=tmp_path) for a in args]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("speedboard: error: ") and err.count("\n") == 1 and message in err, err


def test_generated_text_is_printed_as_it_comes_in_whole_characters(existing_run, capsys):
    """generate prints each token's text as it comes (not all at the end); a character split over byte-level
    tokens is printed once whole, and the text is the one decoded at once."""
    from core.cli import _TextStream
    from core.tokenizer import BPETokenizer

    _, run_dir, _ = existing_run
    tok = BPETokenizer.load(run_dir / "tokenizer.json")
    ids = tok.encode("The café serves 😀 and ünïcode text")
    capsys.readouterr()
    stream = _TextStream(tok, ids[:1])
    pieces = [capsys.readouterr().out]
    for token in ids[1:]:
        stream.add(token)
        pieces.append(capsys.readouterr().out)
    stream.close()
    pieces.append(capsys.readouterr().out)
    assert "".join(pieces) == tok.decode(ids) + "\n" == "The café serves 😀 and ünïcode text\n"
    assert not any("\ufffd" in p for p in pieces)
    assert sum(1 for p in pieces if p) > 5  # printed along the way


@pytest.mark.parametrize("terminal", [True, False])
def test_generated_control_characters_are_shown_on_a_terminal_and_kept_in_a_pipe(terminal, monkeypatch, capsys):
    """A model's escape sequence (text with ANSI colours in its corpus) recoloured or cleared the user's terminal."""
    from core.cli import _TextStream

    class Letters:  # one character per id
        def decode(self, ids):
            return "".join(map(chr, ids))

    monkeypatch.setattr(sys.stdout, "isatty", lambda: terminal, raising=False)
    text = "red \x1b[31mtext\x1b[0m\r\x07\x9b2J\tend\nnext é"
    stream = _TextStream(Letters(), [])
    for ch in text:
        stream.add(ord(ch))
    stream.close()
    shown = capsys.readouterr().out
    if terminal:
        assert shown == "red \\x1b[31mtext\\x1b[0m\\x0d\\x07\\x9b2J\tend\nnext é\n"
    else:
        assert shown == text + "\n"


@pytest.mark.parametrize("style", ["metaspace", "llama"])
def test_streamed_text_keeps_the_spaces_of_sentencepiece_style_decoders(style, capsys):
    """Metaspace (Mistral, T5) and Llama-2's Replace + Strip decoders drop a word's leading space when its token
    is decoded alone: each token printed on its own glued the words together."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    from core.cli import _TextStream
    from core.tokenizer import BPETokenizer

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=style == "llama"))
    if style == "metaspace":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        tok.decoder = decoders.Metaspace(prepend_scheme="first")
    else:  # as Llama-2's tokenizer.json: spaces become ▁ in the normalizer, the decoder strips the first one
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    text = "the quick brown fox jumps over the lazy dog"
    tok.train_from_iterator([text] * 50, trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", "</s>"]))
    wrapped = BPETokenizer(tok, eos="</s>")
    ids = wrapped.encode("the quick brown fox")
    assert wrapped.decode(ids) == "the quick brown fox"
    stream = _TextStream(wrapped, ids[:2])
    for token in ids[2:]:
        stream.add(token)
    stream.close()
    assert capsys.readouterr().out == "the quick brown fox\n"


@pytest.mark.parametrize("command", [["generate", ""], ["export", "{run}", ""], ["export", "", "{tmp}/hf"],
                                     ["train", "--out", " ", "--steps", "1"]])
def test_an_empty_path_is_refused_not_taken_for_the_current_folder(command, existing_run, tmp_path, capsys,
                                                                  monkeypatch):
    _, run_dir, snapshot = existing_run
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main([a.format(run=run_dir, tmp=tmp_path) for a in command])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "expected a path, got an empty one" in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


LONG_NAME = "x" * 300
DEEP_PATH = "/".join(["y" * 200] * 25)


@pytest.mark.parametrize("command", [
    ["train", "--out", "{tmp}/" + LONG_NAME, "--steps", "1"], ["train", "--resume", "{tmp}/" + LONG_NAME],
    ["generate", "{tmp}/" + LONG_NAME], ["export", "{run}", "{tmp}/" + LONG_NAME],
    ["train", "--init-from", "{tmp}/" + DEEP_PATH],
])
def test_a_path_the_system_cannot_name_is_one_line_not_file_name_too_long(command, existing_run, tmp_path, capsys):
    """A name over 255 bytes, or a path over 4,095: stat raised "File name too long" (a traceback) where a missing
    file or a folder to create was expected."""
    _, run_dir, snapshot = existing_run
    with pytest.raises(SystemExit) as exit_:
        main([a.format(run=run_dir, tmp=tmp_path) for a in command])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("bytes long: more than the" in err), err
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == snapshot


def test_an_output_folder_from_a_config_file_that_cannot_be_named_is_refused(tmp_path):
    from core.errors import SpeedboardError
    from core.runs import check_run_root

    with pytest.raises(SpeedboardError, match="300 bytes long"):
        check_run_root(tmp_path / LONG_NAME)


def test_an_error_while_generating_comes_on_a_line_of_its_own(existing_run, capsys, monkeypatch):
    from core.errors import NotFinite
    from core.model import LlamaForCausalLM

    _, run_dir, _ = existing_run

    def fail_after_one_token(self, idx, max_new_tokens, *, on_token, **kwargs):
        on_token(int(idx[0, -1]))
        raise NotFinite("the model's outputs are not finite")

    monkeypatch.setattr(LlamaForCausalLM, "generate", fail_after_one_token)
    capsys.readouterr()
    assert main(["generate", str(run_dir), "--prompt", "The cat"]) == 2
    out, err = capsys.readouterr()
    assert out.startswith("The cat") and out.endswith("\n") and out.count("\n") == 1, repr(out)
    assert err == "speedboard: error: the model's outputs are not finite\n"


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize("signum, code, line", [(signal.SIGINT, 130, "speedboard: interrupted"),
                                                (signal.SIGTERM, 143, "speedboard: terminated (SIGTERM)"),
                                                (signal.SIGHUP, 129, "speedboard: the terminal was closed (SIGHUP)")])
def test_a_signal_ends_generate_in_one_line_after_the_text_ends_its_own(existing_run, signum, code, line):
    """kill -INT: also in a background job, which a shell starts with SIGINT ignored. SIGTERM and SIGHUP: said as
    by every other command, where the process ended silently with its text's line unfinished."""
    _, run_dir, _ = existing_run
    proc = subprocess.Popen([sys.executable, "-m", "core.cli", "generate", str(run_dir), "--max-new-tokens",
                             "1000000", "--temperature", "1", "--device", "cpu"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert proc.stdout.read(1)  # generation has begun
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert err.strip() == line and out.endswith("\n"), (err, out[-50:])


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize("name, code, line", [("SIGTERM", 143, "speedboard: terminated (SIGTERM)"),
                                              ("SIGHUP", 129, "speedboard: the terminal was closed (SIGHUP)")])
def test_a_signal_during_an_export_leaves_no_half_written_folder(existing_run, tmp_path, name, code, line):
    """A closed terminal (SIGHUP) killed export with its default action: no line, and the hidden folder it was
    writing (hundreds of MB for a real model) stayed. The signal comes here right after the weights are written."""
    _, run_dir, _ = existing_run
    out = tmp_path / "exports" / "model"
    out.parent.mkdir()
    script = (f"import os, signal, sys\n"
              f"import core.checkpoint.save as save\n"
              f"real = save.save_file\n"
              f"def save_then_signal(*args, **kwargs):\n"
              f"    real(*args, **kwargs)\n"
              f"    os.kill(os.getpid(), signal.{name})\n"
              f"save.save_file = save_then_signal\n"
              f"from core.cli import main\n"
              f"sys.exit(main(['export', {str(run_dir)!r}, {str(out)!r}]))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    assert done.stderr.strip() == line and done.stdout == ""
    assert list(out.parent.iterdir()) == []  # neither the export nor its hidden temporary folder


def test_lr_scales_the_schedule_and_its_floor_keeps_its_ratio(tmp_path):
    from core.cli import build_parser, config_from_args

    def parsed(*flags):
        return config_from_args(build_parser().parse_args(["train", *flags])).train

    assert parsed("--lr", "1e-3").min_lr == pytest.approx(1e-4)  # a preset's floor: a tenth
    assert parsed("--lr", "1e-3", "--min-lr", "0").min_lr == 0
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"preset": "tiny", "train": {"lr": 2e-3, "min_lr": 0.0}}))
    assert parsed("--config", str(path), "--lr", "1e-3").min_lr == 0  # the file's floor of 0 stays 0
    path.write_text(json.dumps({"preset": "tiny", "train": {"lr": 2e-3, "min_lr": 1e-3}}))
    assert parsed("--config", str(path), "--lr", "1e-3").min_lr == pytest.approx(5e-4)  # half, as in the file


def test_a_config_file_a_windows_editor_saved_with_a_byte_order_mark_is_read(tmp_path):
    from core.cli import _read_config_data

    path = tmp_path / "config.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"preset": "tiny"}).encode())
    assert _read_config_data(str(path)) == {"preset": "tiny"}


@pytest.mark.parametrize("text, words", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"train": {"lr": ' + "9" * 5000 + "}}", "an integer of more than 4,300 digits)"),  # not Python's advice
    ('{"preset": "tiny", "train": {"lr": 1' + "0" * 400 + "}}", "not a valid run configuration"),  # lr / 10
    # JSON keeps a key's last value: the small preset trained where the file said tiny first.
    ('{"preset": "tiny", "preset": "small"}', "(the key 'preset' is given twice in one object)"),
    ('{"train": {"lr": 0.1, "lr": 0.2}}', "(the key 'lr' is given twice in one object)"),
])
def test_a_config_file_of_pathological_json_is_one_line(text, words, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(text)
    assert main(["train", "--config", str(path), "--steps", "1", "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_generate_to_a_full_device_is_one_line(existing_run):
    _, run_dir, _ = existing_run
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "core.cli", "generate", str(run_dir), "--device", "cpu"],
                              cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "speedboard: error: cannot write the generated text (No space left on device)"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("args", [["--list"], ["--remove", "all"]])
def test_prepare_list_and_remove_to_a_full_device_are_one_line(args, tmp_path):
    """A traceback each (the stores were removed first, then the line saying so could not be written)."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "core.cli", "prepare", *args], cwd=ROOT, stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120,
                              env={**os.environ, "SPEEDBOARD_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "speedboard: error: cannot write to standard output (No space left on device)"


@pytest.mark.parametrize("stopped, said", [(False, "finished"), (True, "was stopped")])
def test_a_run_without_its_final_checkpoint_says_how_it_ended(stopped, said, tmp_path, capsys, monkeypatch):
    from core.trainer import RunResult, Trainer

    monkeypatch.setattr(Trainer, "run", lambda self: RunResult("r", tmp_path, 7, 70, stopped, 1.0, None, None,
                                                               None, None))
    assert main(["train", *SMALL, "--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (f"speedboard: error: the run {said} at step 7, but its final checkpoint "
                                       f"could not be saved (see the warning above)\n")


def test_a_console_that_cannot_write_a_character_gets_its_escape_not_a_lost_line(tmp_path):
    """Under PYTHONIOENCODING=ascii (or a C locale) every line holding "…", "×" or "é" was dropped whole."""
    cache = tmp_path / "café"
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "SPEEDBOARD_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, "-m", "speedboard.cli", "prepare", "--list"], env=env,
                          capture_output=True, text=True, encoding="ascii", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"no token stores in {tmp_path}/caf\\xe9/stores\n"


def test_a_file_name_that_is_not_utf8_is_written_with_its_byte_not_a_surrogate(tmp_path):
    """A name's byte E9 (Latin-1 "é") was written as "\\udce9", which is no form of the name."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("some text here\n\n" * 50)
    bad = os.fsdecode(bytes(folder / "bad") + b"\xe9.txt")
    with open(bad, "wb") as f:
        f.write(b"x\xffy")
    env = {**os.environ, "SPEEDBOARD_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "speedboard.cli", "prepare", str(folder)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"{folder}/bad\\xe9.txt is not UTF-8 text" in proc.stderr and "udce9" not in proc.stderr, proc.stderr


def test_an_abbreviated_flag_is_refused_in_one_line(capsys):
    """`--ru` was taken for --run-id here, and with --nproc reached torchrun's parser, where it is ambiguous
    (23 lines of usage, after the data was prepared)."""
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--ru", "x", "--steps", "1"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "speedboard: error: unrecognized arguments: --ru x\n"


def _cli_process(args: list[str], tmp_path: Path, **popen) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPEEDBOARD_CACHE_DIR": str(tmp_path / "cache")}
    code = "import sys; from core.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, timeout=300, **popen)


def test_a_closed_stderr_or_a_full_stdout_leaves_the_work_done(tmp_path):
    """`train … 2>&-` exited 1 without a word (sys.stderr is None there), and `export … > /dev/full` printed a
    traceback after writing the whole export."""
    out = _cli_process(["train", *SMALL, "--steps", "1", "--out", str(tmp_path / "runs")], tmp_path,
                       stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(2))
    assert out.returncode == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    if Path("/dev/full").exists():
        with open("/dev/full", "w") as full:
            out = _cli_process(["export", str(run_dir), str(tmp_path / "hf")], tmp_path, stdout=full,
                               stderr=subprocess.PIPE, text=True)
        assert out.returncode == 0 and out.stderr == "" and (tmp_path / "hf" / "config.json").is_file()


def test_generate_with_stdout_closed_says_the_text_has_nowhere_to_go(tmp_path):
    torch.save({"w": torch.zeros(1)}, tmp_path / "model.pt")
    out = _cli_process(["generate", str(tmp_path / "model.pt")], tmp_path, stderr=subprocess.PIPE, text=True,
                       preexec_fn=lambda: os.close(1))
    assert out.returncode == 2
    assert out.stderr == "speedboard: error: standard output is closed: there is nowhere to write the generated " \
                         "text\n"


def test_a_deleted_current_folder_is_one_line(tmp_path):
    """A relative path raised a 51-line traceback there, and torch's import failed naming oneMKL."""
    gone = tmp_path / "gone"
    gone.mkdir()

    def enter_then_delete() -> None:
        os.chdir(gone)
        os.rmdir(gone)

    out = _cli_process(["export", str(tmp_path), "relative"], tmp_path, capture_output=True, text=True,
                       preexec_fn=enter_then_delete)
    assert out.returncode == 2
    assert out.stderr == "speedboard: error: the current folder no longer exists (deleted or moved since the shell " \
                         "entered it); cd to an existing folder and run the command again\n"


@pytest.mark.parametrize("command", [["train", *SMALL, "--steps", "1"],
                                     ["tune", *SMALL[:8], "--cells", "off-a1-*,off-a2-*", "--precisions", "fp32",
                                      "--repeats", "1", "--trial-steps", "1", "--budget-seconds", "120"]])
def test_a_compile_cache_folder_that_cannot_be_made_is_one_line(tmp_path, command):
    """torch.compile makes its cache folder when it is imported, with compile off too: one that cannot be made
    (below a file, on a read-only disk) was an OSError traceback from train and from tune's first trial."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(blocker / "inductor")}
    extra = ["--json", str(tmp_path / "t.json")] if command[0] == "tune" else ["--out", str(tmp_path / "runs")]
    done = subprocess.run([sys.executable, "-m", "core.cli", *command, *extra], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"speedboard: error: cannot make torch.compile's cache folder {blocker / 'inductor'}: Not a directory; set "
        f"TORCHINDUCTOR_CACHE_DIR to a folder that can be written")
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "t.json").exists()


def test_generate_says_when_the_model_cannot_read_the_whole_text(existing_run, capsys, monkeypatch):
    """A prompt longer than the model's positions lost its beginning without a word (its text then differed from
    the exported model's in transformers); a generation that outgrows them reads a sliding window."""
    _, run_dir, _ = existing_run
    positions = json.loads((run_dir / "config.json").read_text())["config"]["model"]["max_position_embeddings"]
    capsys.readouterr()
    assert main(["generate", str(run_dir), "--prompt", "word " * (2 * positions), "--max-new-tokens", "2"]) == 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("warning: the prompt is ") and err.endswith(" are not read"), err
    assert f"the model has {positions} positions: its first " in err, err
    # A text that ends at its EOS before the positions: nothing to say, whatever --max-new-tokens allowed (it
    # warned before the text, from the flag).
    from core.model import LlamaForCausalLM

    original = LlamaForCausalLM.generate

    def ending_after(n):
        def generate(self, idx, max_new_tokens, **kw):
            return original(self, idx, n, **{**kw, "eos_id": None})
        return generate

    monkeypatch.setattr(LlamaForCausalLM, "generate", ending_after(3))
    assert main(["generate", str(run_dir), "--prompt", "The", "--max-new-tokens", str(3 * positions)]) == 0
    assert capsys.readouterr().err == ""
    # BOS, "The" and positions - 1 new tokens: the last is printed, never read.
    monkeypatch.setattr(LlamaForCausalLM, "generate", ending_after(positions - 1))
    assert main(["generate", str(run_dir), "--prompt", "The", "--max-new-tokens", str(3 * positions)]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(LlamaForCausalLM, "generate", ending_after(positions))
    assert main(["generate", str(run_dir), "--prompt", "The", "--max-new-tokens", str(3 * positions)]) == 0
    assert capsys.readouterr().err.strip() == (f"warning: the text grew past {positions} tokens (its BOS "
                                              f"included): each token after them was chosen from the last "
                                              f"{positions} only (the model's positions)")


@pytest.mark.parametrize("command", ["generate", "train"])
def test_a_checkpoints_config_json_given_as_config_says_what_to_give(command, existing_run, capsys):
    """--config CHECKPOINT/config.json: "unknown key 'format' in the configuration", which named no way out."""
    _, run_dir, _ = existing_run
    checkpoint = sorted((run_dir / "checkpoints").iterdir())[-1]
    args = ([str(checkpoint / "model.safetensors"), "--tokenizer", str(run_dir / "tokenizer.json")]
            if command == "generate" else ["--steps", "1"])
    capsys.readouterr()
    assert main([command, *args, "--config", str(checkpoint / "config.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"{checkpoint / 'config.json'} is a checkpoint's config.json, not a run configuration: give "
                        f"the checkpoint folder itself ({checkpoint}), which brings its model, tokenizer and "
                        f"settings, or its run folder's config.json"), err


def test_the_progress_bar_draws_each_step_count_beside_that_steps_figures():
    """The bar was drawn by its count's update before the step's loss and tokens/s were set: each count stood
    beside the step before's figures."""
    from core.cli import ConsoleSink
    from core.events import StepMetrics

    class Bar:  # tqdm's part the sink uses: update draws, with the postfix set so far
        def __init__(self):
            self.n, self.postfix, self.drawn = 0, {}, []

        def set_postfix(self, refresh=True, **figures):
            self.postfix = figures

        def update(self, n):
            self.n += n
            self.drawn.append((self.n, self.postfix))

    sink = ConsoleSink(log_every=1000, progress=False)
    sink.bar = bar = Bar()
    for step, loss in ((1, 7.6), (2, 7.5), (3, 7.25)):
        sink(StepMetrics("r", 0.0, step=step, tokens=step * 64, loss=loss, lr=1e-3, grad_norm=1.0,
                         tokens_per_s=1000.0 * step, step_time=0.1, peak_mem_gib=0.0, mem_gib=0.0, mfu=0.1))
    assert bar.drawn == [(1, {"loss": "7.600", "tok_s": "1,000"}), (2, {"loss": "7.500", "tok_s": "2,000"}),
                         (3, {"loss": "7.250", "tok_s": "3,000"})]


def test_a_run_id_is_refused_as_ascii_it_must_be():
    """"letters" was said of a name refused for its ü, a letter."""
    from core.errors import ConfigError
    from core.runs import check_run_id

    with pytest.raises(ConfigError, match=r"must be a plain folder name \(ASCII letters, digits"):
        check_run_id("rün")


@pytest.mark.parametrize("launcher", [True, False])
def test_a_rank_that_lost_its_peers_is_quiet_under_the_launcher(launcher, monkeypatch, capsys, tmp_path):
    """Under `train --nproc` the launcher names the failed ranks in one line; a survivor whose collective failed
    before torchrun's SIGTERM reached it printed its own line first. Under a bare torchrun it says it."""
    from core.distributed import PeerLost
    from core.runs import CLAIM_ENV
    from core.trainer import Trainer

    def lost(self):
        raise PeerLost("rank 0: another process of this job failed or stopped, so this one cannot continue")

    monkeypatch.setattr(Trainer, "run", lost)
    if launcher:
        monkeypatch.setenv(CLAIM_ENV, "token")
    else:
        monkeypatch.delenv(CLAIM_ENV, raising=False)
    assert main(["train", *SMALL, "--steps", "1", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == ("" if launcher else "speedboard: error: rank 0: another process of this job failed or stopped, "
                                       "so this one cannot continue\n"), err


def test_generate_into_a_pipe_closed_early_ends_quietly_with_sigpipes_code(existing_run):
    """``generate … | head -c 10``: the text is what it is for, so the reader gone ends it, as SIGPIPE ends
    ``cat`` (exit code 141), without a word (``train``'s console goes quiet and the run trains on)."""
    _, run_dir, _ = existing_run
    proc = subprocess.Popen([sys.executable, "-m", "core.cli", "generate", str(run_dir), "--prompt", "The",
                             "--max-new-tokens", "100000", "--temperature", "1"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout.read(3) == b"The"
    proc.stdout.close()  # head exits
    assert proc.wait(240) == 141
    assert proc.stderr.read() == b""
