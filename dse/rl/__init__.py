"""Search as reinforcement learning: the search as an RL episode (``searchgame``: action, observation, reward, stop
rule), a learned search policy (``policy``, Stable-Baselines3 PPO, the ``rl`` extra) and its training on twins of
a space (``training``, ``dse train-policy``). The game and the policy sit below the agents and the environment
that use them; the training above the environment it drives.
"""
