"""Stable-Baselines3's PPO trains on the vectorised twins of a small shipped space, then searches a twin it never saw.

python docs/examples/sb3_ppo.py [STEPS]   # default 20000 PPO steps (minutes on a CPU: the learner dominates)
"""

from __future__ import annotations

import sys

import gymnasium as gym
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import DummyVecEnv

import dse.envs  # noqa: F401  (registers dse/Recipe-v0)

SPACE = "conf/spaces/nemotron3_8b_space.toml"  # 216 points, 162 valid
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000

# Eight twins (seeds 1000..1007), one per sub-environment, sharing one table of the space. SB3 trains on its own
# VecEnv type, so its DummyVecEnv is handed the sub-environments of Gymnasium's vector form.
twins = gym.make_vec("dse/Recipe-v0", num_envs=8, space=SPACE, twin_seed=1000, budget=30)
model = PPO("MlpPolicy", DummyVecEnv([lambda e=e: e for e in twins.envs]), n_steps=64, batch_size=64, seed=0)
model.learn(total_timesteps=steps)

# One search on twin 0, which the policy never trained on: propose, observe, until the budget or the policy stops.
env = gym.make("dse/Recipe-v0", space=SPACE, twin_seed=0, budget=30)
obs, info = env.reset()  # no seed: the twin stays twin 0 (a seed would draw another)
terminated = truncated = False
while not (terminated or truncated):
    action, _ = model.predict(obs)
    action[-1] = 0  # its last entry is stop: this search spends the whole budget, however briefly PPO trained
    obs, reward, terminated, truncated, info = env.step(action)
print(f"best found: {info['best_fraction']:.3f} of the model's best forecast, after {info['runs']} runs")
