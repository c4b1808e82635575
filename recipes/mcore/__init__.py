"""A real training payload: minimal Megatron-core GPT pretraining on mock data (``python -m recipes.mcore``).

It prints Megatron-LM's iteration and memory lines, so that dse's local backend, log parser and performance
model can be checked against real GPU runs. See README.md beside this file. Importing the package needs no
torch; :mod:`recipes.mcore.train` imports torch and megatron inside its functions.
"""
