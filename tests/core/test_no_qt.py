"""core/ never imports Qt or pyqtgraph: every module imports, and a step trains, with them blocked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import importlib, pkgutil, sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("PySide6", "PyQt5", "PyQt6", "shiboken6", "pyqtgraph"):
            raise ImportError(f"blocked: {name}")
        return None

sys.meta_path.insert(0, Block())
import core
for mod in pkgutil.walk_packages(core.__path__, "core."):
    importlib.import_module(mod.name)

from core.config import DataConfig, ModelConfig, RunConfig, TrainConfig
from core.trainer import train
cfg = RunConfig(
    model=ModelConfig(vocab_size=300, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                      intermediate_size=32, max_position_embeddings=32),
    data=DataConfig(seq_len=16, vocab_size=300),
    train=TrainConfig(micro_batch=2, budget=1, device="cpu", eval_batches=1, sample_tokens=2),
    out_dir=sys.argv[1],
)
result = train(cfg)
assert result.step == 1
assert not any(m.split(".")[0] in ("PySide6", "pyqtgraph") for m in sys.modules)
print("ok")
"""


def test_core_imports_and_trains_without_qt(tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")
