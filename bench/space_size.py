"""What the walk limit costs: seconds per raw point checked against the rules, the exact count of a space at
``WALK_LIMIT`` raw points, the sampled estimate of a 10^12-point space, and random's give-up on an all-invalid
one (``MAX_INVALID_DRAWS`` draws). Prints figures; asserts nothing.

    python bench/space_size.py
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from dse.agents.random import MAX_INVALID_DRAWS, RandomAgent
from dse.envs.recipe_env import RecipeEnv
from dse.rules.counting import SAMPLES, count_valid
from dse.rules.space import WALK_LIMIT, load_space
from dse.study.loop import make_backend


def write(path: Path, knobs: dict) -> Path:
    lines = [
        'name = "bench"',
        'recipe = "llama3_8b"',
        'system = "h100"',
        "num_nodes = 1",
        "",
        "[settings]",
        "gbs = 128",
        "",
        "[knobs]",
    ] + [f"{json.dumps(k)} = {json.dumps(v)}" for k, v in knobs.items()]
    path.write_text("\n".join(lines + ["", "[backend]", 'kind = "sim"', 'payload = "sim"', ""]))
    return path


def main() -> None:
    core = {"tp": [1, 2, 3, 4, 6, 8], "pp": [1, 2, 4], "mbs": [1, 2, 4]}  # 54 points, 18 valid
    with tempfile.TemporaryDirectory() as d:
        walk = load_space(
            write(
                Path(d) / "walk.toml",
                {**core, "env.NCCL_A": list(range(40)), "env.NCCL_B": list(range(WALK_LIMIT // 54 // 40))},
            )
        )
        t = time.perf_counter()
        c = count_valid(walk)
        dt = time.perf_counter() - t
        print(f"exact count of {c.raw:,} raw points ({c.valid:,} valid): {dt:.2f} s = {1e6 * dt / c.raw:.1f} us/point")
        big = load_space(
            write(Path(d) / "big.toml", {**core, **{f"env.NCCL_K{i}": list(range(10)) for i in range(11)}})
        )
        t = time.perf_counter()
        c = count_valid(big)
        print(
            f"estimate of {c.raw:,} raw points from {SAMPLES:,} draws: about {c.valid:,} valid "
            f"(95% {c.valid_low:,} to {c.valid_high:,}; truth {c.raw // 3:,}) in {time.perf_counter() - t:.2f} s"
        )
        bad = load_space(
            write(Path(d) / "bad.toml", {"tp": [3, 5, 6, 7], **{f"env.NCCL_K{i}": list(range(10)) for i in range(12)}})
        )
        env = RecipeEnv(bad, make_backend("sim", bad, 0), Path(d) / "runs", run_dirs=lambda: Path(d) / "runs" / "x")
        agent = RandomAgent(env.action_space, seed=0, action_mask=env.action_mask)
        t = time.perf_counter()
        assert agent.propose() is None
        print(
            f"random on an all-invalid space of {bad.size:,} raw points gives up after {MAX_INVALID_DRAWS:,} "
            f"draws in {time.perf_counter() - t:.2f} s"
        )


if __name__ == "__main__":
    main()
