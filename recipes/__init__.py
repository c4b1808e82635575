"""Model architectures, per-GPU defaults and the payloads that run inside the training container.

Nothing here imports the controller (`dse`, `agents`, `envs`): payloads receive their configuration through
argv and the environment, and the controller reads the plain data in :mod:`recipes.models`.
"""
