"""The Megatron-Bridge payload: ``python -m recipes.mbridge --recipe llama3_8b_pretrain_config <overrides>``.

For newer containers, where NeMo 2's recipes give way to ``megatron.bridge`` (Python 3.12, Llama recipes only
here). :mod:`argv` is plain Python the controller's tests check; :mod:`__main__` needs Megatron-Bridge.
"""
