"""Small builders shared by tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

SMALL_SPACE = """
name = "small"
recipe = "llama3_70b_16l"
system = "h100"
num_nodes = 2

[settings]
seq_length = 4096
gbs = 32
max_steps = 20

[knobs]
tp = [1, 2, 4, 8]
pp = [1, 2, 4]
vp = [1, 2]
mbs = [1, 2]

[objective]
metric = "tflops_per_gpu"

[search]
agent = "grid"
seed = 0
"""


def write_space(tmp_path: Path, text: str = SMALL_SPACE, name: str = "space.toml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p
