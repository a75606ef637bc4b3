"""What the documentation shows runs: the README's usage example (the block after the
readme-example mark) and the training example (a few steps)."""
import re
import subprocess
import sys

from conftest import REPO


def test_readme_example_runs(capsys):
    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- readme-example[^>]*-->\s*```python\n(.*?)```", text, re.S)
    assert block, "README.md has no readme-example block"
    code = block.group(1)
    assert len(code.strip().splitlines()) == 5
    exec(compile(code, "README.md", "exec"), {})
    assert "torch.Size([1, 64, 4, 16])" in capsys.readouterr().out


def test_training_example_runs():
    out = subprocess.run([sys.executable, str(REPO / "python/examples/train_tiny.py"), "--steps",
                          "3", "--phi", "mlp"], check=True, capture_output=True, text=True).stdout
    assert "step    2  loss" in out
