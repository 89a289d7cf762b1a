"""Every Python block of the README runs as written, in order, in one namespace.

The one change made to the text (the switch the README mentions): training is cut to 2 batches and evaluation to 1,
every ``max_duration="..."`` becoming ``"2ba"``, every ``Trainer(`` getting ``eval_subset_num_batches=1`` and
``jaxcomposer.fit(path)`` the overrides ``max_duration=2ba``, ``eval_subset_num_batches=1`` and a temporary
``run_dir``. Nothing else is rewritten, so a block that names something it never defines fails here.
"""
import re
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"
pytestmark = pytest.mark.slow  # Fashion-MNIST, four short fits and a few torch exports: start it early


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def shortened(code: str, run_dir: Path) -> str:
    code = re.sub(r'max_duration="[^"]+"', 'max_duration="2ba"', code)
    code = re.sub(r'\bTrainer\(', 'Trainer(eval_subset_num_batches=1, ', code)
    return re.sub(r'jaxcomposer\.fit\(("[^"]+")\)',
                  rf'jaxcomposer.fit(\1, ["max_duration=2ba", "eval_subset_num_batches=1", "run_dir={run_dir}", '
                  r'"progress_bar=false"])', code)


def test_readme_has_the_blocks_we_expect():
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 3 and all(shortened(b, Path("/x")) != b for b in blocks if "max_duration" in b)


def test_every_readme_block_runs_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(README.parent)  # the blocks name configs/ relative to the repository
    namespace: dict = {"__name__": "readme"}
    for i, block in enumerate(python_blocks(README.read_text())):
        code = compile(shortened(block, tmp_path / "runs"), f"README.md python block {i + 1}", "exec")
        exec(code, namespace)  # noqa: S102 - the README is ours; running it is the point
    assert (tmp_path / "runs" / "quickstart" / "metrics.jsonl").is_file()
