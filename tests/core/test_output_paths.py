"""Where a run writes: every user path resolved once, the same way; an output that cannot be written is one
line and exit code 2 before anything is created, with one process or several."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from core import checkpoint as ck
from core.cli import main
from core.paths import user_path, why_not_writable
from tests.core.checkpoint_helpers import corpus_file, make_model

pytestmark = pytest.mark.usefixtures("single_thread")


def small(tmp_path: Path) -> list[str]:
    return ["--data", str(corpus_file(tmp_path)), "--vocab-size", "300", "--seq-len", "32", "--micro-batch", "2",
            "--steps", "1", "--eval-every", "0", "--no-progress"]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("speedboard: error: ") and err.count("\n") == 1, err
    return err.strip()


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("not a folder")
    return path


@pytest.mark.parametrize("where", ["out_is_a_file", "out_below_a_file", "home_is_a_file", "nproc_out_is_a_file"])
def test_an_output_in_the_way_of_a_file_is_one_line_before_anything_is_created(where, tmp_path, a_file, capsys,
                                                                             monkeypatch):
    before = sorted(tmp_path.rglob("*"))
    args = ["train", *small(tmp_path)]
    if where == "home_is_a_file":
        monkeypatch.setenv("SPEEDBOARD_HOME", str(a_file))
    else:
        args += ["--out", str(a_file if where != "out_below_a_file" else a_file / "runs")]
    if where == "nproc_out_is_a_file":
        args += ["--nproc", "2", "--device", "cpu"]  # refused before torchrun starts: one line, not one per process
    assert main(args) == 2
    err = one_error_line(capsys)
    assert f"cannot create run folders in {a_file}" in err and f"{a_file} is a file, not a folder" in err, err
    assert ("SPEEDBOARD_HOME" in err) == (where == "home_is_a_file")
    assert a_file.read_text() == "not a folder"
    after = sorted(p for p in tmp_path.rglob("*") if p.name != "corpus.txt")
    assert after == [p for p in before if p.name != "corpus.txt"]  # nothing created


def test_a_read_only_output_is_one_line(tmp_path, capsys, monkeypatch):
    """A read-only file system (simulated: the test runs as a user that may write anywhere)."""
    out = tmp_path / "mnt" / "runs"
    (tmp_path / "mnt").mkdir()
    monkeypatch.setattr("core.paths._read_only", lambda path: Path(path) == tmp_path / "mnt")
    assert why_not_writable(out) == f"{tmp_path / 'mnt'} is on a read-only file system"
    assert main(["train", *small(tmp_path), "--out", str(out)]) == 2
    assert "is on a read-only file system" in one_error_line(capsys)
    assert list((tmp_path / "mnt").iterdir()) == []


def test_a_folder_that_cannot_be_created_after_the_check_is_still_one_line(tmp_path, capsys, monkeypatch):
    """The check and the creation are apart in time (another process, a mount): the creation's own failure
    is one line too, and nothing is left."""
    real_mkdir = Path.mkdir

    def read_only_mkdir(self, *args, **kwargs):
        if self.parent == tmp_path / "runs":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only_mkdir)
    assert main(["train", *small(tmp_path), "--out", str(tmp_path / "runs")]) == 2
    assert "cannot create the run folder" in one_error_line(capsys)


@pytest.mark.parametrize("signal_", [KeyboardInterrupt, SystemExit])
def test_a_signal_while_the_run_folder_is_written_leaves_no_folder(signal_, tmp_path, monkeypatch):
    """Ctrl-C (or a SIGTERM's abort) between creating the run folder and finishing its files: no half folder."""
    from core.trainer import Trainer

    def interrupted(self):
        (self.run_dir / "config.json").write_text("{")  # half written when the signal comes
        raise signal_()

    monkeypatch.setattr(Trainer, "_write_run_files", interrupted)
    argv = ["train", *small(tmp_path), "--out", str(tmp_path / "runs")]
    if signal_ is KeyboardInterrupt:
        assert main(argv) == 130
    else:
        with pytest.raises(SystemExit):
            main(argv)
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


def test_a_tilde_in_out_is_the_home_folder_for_every_file_of_the_run(tmp_path, monkeypatch, capsys):
    """``--out '~/x'`` (quoted, so no shell expanded it): config, metrics and checkpoints all under $HOME/x."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    assert main(["train", *small(tmp_path), "--out", "~/x"]) == 0
    (run_dir,) = (home / "x").iterdir()
    assert {"config.json", "metrics.jsonl", "tokenizer.json", "checkpoints"} <= {p.name for p in run_dir.iterdir()}
    assert ck.list_checkpoints(run_dir / "checkpoints")
    assert list(cwd.iterdir()) == []  # no ./~ folder
    assert user_path("~/x") == home / "x" and user_path("rel") == cwd / "rel"
    # The same resolver for every path a user gives: a relative checkpoint path, a save request.
    monkeypatch.chdir(home)
    assert ck.read_checkpoint(Path("x") / run_dir.name).source.parent.parent == run_dir


def test_a_tilde_in_the_folders_set_by_the_environment_is_the_home_folder(tmp_path, monkeypatch):
    """SPEEDBOARD_CACHE_DIR='~/c' (quoted in a service's environment) made a ./~/c folder; SPEEDBOARD_HOME did not."""
    from core.runs import default_out_dir
    from core.tokenizer import cache_dir

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", "~/c")
    monkeypatch.setenv("SPEEDBOARD_HOME", "~/h")
    assert cache_dir() == home / "c" and default_out_dir() == home / "h" / "runs"
    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", "rel")
    assert cache_dir() == cwd / "rel"  # made absolute where it is read: a later chdir does not move it


def test_an_empty_home_is_no_home_for_a_tilde(monkeypatch):
    """With HOME="" ``~/runs`` was ``/runs`` (Python's expanduser takes it for the root)."""
    import pwd

    monkeypatch.setenv("HOME", "")
    account = pwd.getpwuid(os.getuid()).pw_dir
    assert user_path("~/runs") == Path(account) / "runs" and user_path("~") == Path(account)


def test_export_to_a_path_below_a_file_says_so(tmp_path, a_file, tok, capsys):
    checkpoint = ck.save_checkpoint(tmp_path / "ckpt", make_model(0), tokenizer=tok)
    assert main(["export", str(checkpoint), str(a_file / "exported")]) == 2
    err = one_error_line(capsys)
    assert err.endswith(f"cannot write the export to {a_file / 'exported'}: {a_file} is a file, not a folder"), err
    assert a_file.read_text() == "not a folder"


def test_export_to_a_symbolic_link_loop_is_one_line(tmp_path, tok, capsys):
    """ln -s loop loop; speedboard export CKPT loop: a RuntimeError traceback ("Symlink loop")."""
    checkpoint = ck.save_checkpoint(tmp_path / "ckpt", make_model(0), tokenizer=tok)
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    for name in ("loop", "a"):
        assert main(["export", str(checkpoint), str(tmp_path / name)]) == 2
        assert one_error_line(capsys).endswith(f"cannot write the export to {tmp_path / name}: it is a symbolic "
                                               f"link that loops back to itself")


@pytest.mark.parametrize("name", ["a\nb", "tab\there", "bell\x07"])
def test_a_new_name_with_a_control_character_is_refused_in_one_line(name, tmp_path, tok, capsys):
    """An export named "a<newline>b" was written, and every message naming it broke into two lines."""
    checkpoint = ck.save_checkpoint(tmp_path / "ckpt", make_model(0), tokenizer=tok)
    assert main(["export", str(checkpoint), str(tmp_path / name)]) == 2
    assert f"the name {name!r} holds a control character" in one_error_line(capsys)
    assert main(["train", *small(tmp_path), "--out", str(tmp_path / name / "runs")]) == 2
    assert f"the name {name!r} holds a control character" in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "corpus.txt"]
    # A folder of the user's own that has one is theirs to write below.
    (tmp_path / name).mkdir()
    assert why_not_writable(tmp_path / name / "runs") is None


def test_a_run_folder_given_as_out_is_refused_not_nested_into(tmp_path, capsys):
    """--out RUN trained a new run inside RUN, beside its config.json (or inside one of its checkpoints), where
    --resume was most likely meant."""
    out = tmp_path / "runs"
    assert main(["train", *small(tmp_path), "--out", str(out), "--run-id", "first", "--save-every", "1"]) == 0
    run = out / "first"
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    for target, what in ((run, "is a run folder"), (run / "checkpoints" / "step_0000001",
                                                    f"is inside the run folder {run}")):
        assert main(["train", *small(tmp_path), "--out", str(target)]) == 2
        assert one_error_line(capsys).endswith(
            f"{target} {what}, not a folder for run folders; give the folder that holds it ({out}), or --resume "
            f"{run} to continue that run")
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_a_taken_run_id_is_one_line_before_the_corpus_is_prepared(tmp_path, capsys, monkeypatch):
    """Found after the corpus' preparation, a taken --run-id cost minutes on a large corpus first."""
    from core.runs import CLAIM_ENV, CLAIM_FILE, run_id_taken

    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "runs"
    (out / "taken").mkdir(parents=True)
    assert main(["train", *small(tmp_path), "--out", str(out), "--run-id", "taken"]) == 2
    assert one_error_line(capsys) == "speedboard: error: run folder taken already exists; choose another run id"
    assert not (tmp_path / "cache").exists() and list((out / "taken").iterdir()) == []  # nothing prepared
    # A launcher's claim is this run's own folder, not a taken one: its workers go on to take it over.
    from core.paths import WriterLock

    (out / "taken" / CLAIM_FILE).write_text("token")
    launcher = WriterLock(out / "taken" / CLAIM_FILE)  # a live launcher holds its claim
    monkeypatch.setenv(CLAIM_ENV, "token")
    assert not run_id_taken(out, "taken") and not run_id_taken(out, "free")
    monkeypatch.setenv(CLAIM_ENV, "another job's")
    assert run_id_taken(out, "taken")
    launcher.release()


def test_a_full_disk_while_the_run_folder_is_written_leaves_none_of_the_folders_it_created(tmp_path, monkeypatch,
                                                                                          capsys):
    """The run folder went, but the --out folder (and its parents) created for it stayed, empty."""
    from core.trainer import Trainer

    def full(self):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.run_dir / "config.json"))

    monkeypatch.setattr(Trainer, "_write_run_files", full)
    (tmp_path / "kept").mkdir()
    assert main(["train", *small(tmp_path), "--out", str(tmp_path / "kept" / "new" / "runs")]) == 2
    assert "no space left" in one_error_line(capsys).lower()
    assert list((tmp_path / "kept").iterdir()) == []  # new/runs removed again; kept, which existed, stays


def test_paths_too_long_for_what_is_written_below_them_are_one_line_before_training(tmp_path, capsys, monkeypatch):
    """An --out of 4,000 bytes trained, then lost its checkpoint ("File name too long"); a cache folder of
    4,060 bytes was a traceback at the first look below it."""
    deep = tmp_path
    while len(os.fsencode(str(deep))) < 3_900:
        deep = deep / ("d" * 200)
    assert main(["train", *small(tmp_path), "--out", str(deep)]) == 2
    err = one_error_line(capsys)
    assert "with the 300 bytes of what is written below it, more than the 4,095 a path may have" in err, err
    assert list(tmp_path.iterdir()) == [tmp_path / "corpus.txt"]  # nothing created
    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(deep))
    assert main(["train", *small(tmp_path), "--out", str(tmp_path / "runs")]) == 2
    assert "SPEEDBOARD_CACHE_DIR cannot hold the cache (the path is" in one_error_line(capsys)
    assert not (tmp_path / "runs").exists()


def test_a_signal_during_a_tree_removal_goes_on_as_itself_and_the_tree_is_removed(tmp_path, monkeypatch):
    """SIGTERM inside rmtree's own clean-up made it close a descriptor twice: the OSError (EBADF) took the signal's
    place, a traceback and exit code 1 for a tune's trial folder where SIGTERM ends in one line, 143."""
    import errno
    import shutil

    from core.errors import JobTerminated
    from core.paths import remove_tree

    folder = tmp_path / "trial"
    (folder / "sub").mkdir(parents=True)
    real, calls = shutil.rmtree, []

    def interrupted(path, ignore_errors=False):
        calls.append(path)
        if len(calls) == 1:
            try:
                raise JobTerminated("terminated (SIGTERM)")
            finally:
                raise OSError(errno.EBADF, "Bad file descriptor")
        real(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(shutil, "rmtree", interrupted)
    with pytest.raises(JobTerminated, match="terminated"):
        remove_tree(folder)
    assert len(calls) == 2 and not folder.exists()
