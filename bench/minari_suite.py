"""``dse export minari-suite`` at scale: the suite's test split as Minari datasets, at least 1,000 episodes, reloaded.

Writes one dataset per benchmark of ``--split`` (``--episodes`` twins x the agents random and guided, one episode
each, played through the benchmark's environment) into a temporary folder, then loads every dataset back with
Minari, counts its episodes, normalises its returns with ``minari.get_normalized_score`` (random's mean return is 0,
guided's 1) and replays ``--check`` episodes of each in the environment the dataset recovers, asserting the same
observations and rewards. Prints the export's time, the reload's, and per dataset the mean normalised return of
each agent (measured).

BLAS runs on one thread (``OPENBLAS_NUM_THREADS=1``, set before numpy loads): the guided agent inverts a small
matrix per proposal, and a multi-threaded BLAS on a shared CPU made it four times slower.

    python bench/minari_suite.py [--split test] [--episodes 28] [--check 2] [--benchmark ID ...]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402


def replay(ds, ep) -> None:
    """Replay ``ep``'s actions in ``ds``'s recovered environment: the same observations and rewards, or an error."""
    env = ds.recover_environment()
    options = {"twin_seed": int(ep.infos["twin_seed"][0])} if ep.infos["twin_seed"][0] >= 0 else None
    obs, _ = env.reset(options=options)
    assert np.array_equal(obs, ep.observations[0])
    for i, action in enumerate(ep.actions):
        obs, reward, _, _, _ = env.step(action)
        assert np.array_equal(obs, ep.observations[i + 1]) and abs(reward - ep.rewards[i]) < 1e-9, (ds.id, ep.id, i)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="test")
    ap.add_argument("--episodes", type=int, default=28, help="twins per benchmark (each played by random and guided)")
    ap.add_argument("--check", type=int, default=2, help="episodes per dataset replayed in the environment")
    ap.add_argument("--benchmark", nargs="*", default=None, help="suite ids (default: every one of the split)")
    args = ap.parse_args()

    import minari

    from dse.results.offline import to_minari_suite

    with tempfile.TemporaryDirectory(prefix="dse-minari-suite-") as tmp:
        root = Path(tmp)
        out = to_minari_suite(args.split, episodes=args.episodes, only=args.benchmark, datasets_path=root)
        print(f"export: {len(out.datasets)} datasets, {out.episodes} episodes in {out.seconds:.0f} s (measured)")
        os.environ["MINARI_DATASETS_PATH"] = str(root)
        t0 = time.perf_counter()
        total = 0
        print("| dataset | episodes | steps | random (normalised) | guided (normalised) |")
        print("| --- | --- | --- | --- | --- |")
        for dataset_id, n, _, _ in out.datasets:
            ds = minari.load_dataset(dataset_id)
            assert ds.total_episodes == n
            eps = list(ds.iterate_episodes())
            returns = np.array([e.rewards.sum() for e in eps])
            agent = np.array([e.infos["agent"][0] for e in eps])
            norm = minari.get_normalized_score(ds, returns)
            total += len(eps)
            for ep in eps[: args.check]:
                replay(ds, ep)
            print(
                f"| {dataset_id} | {n} | {ds.total_steps} | {norm[agent == 0].mean():.2f} | {norm[agent == 1].mean():.2f} |"
            )
        print(
            f"reloaded {total} episodes, {args.check} per dataset replayed exactly, in "
            f"{time.perf_counter() - t0:.0f} s (measured)"
        )


if __name__ == "__main__":
    main()
