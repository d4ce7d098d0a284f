"""Helpers for testing code that uses mok (as `torch.testing` is for PyTorch): raw-bit comparison with the first
mismatch (`bits`), layer configs and seeded inputs (`cases`), a plain PyTorch layer and the 2x error rule
(`plain`, `tolerance`), running the layer sharded over W processes (`runner`, `dist`), and what autograd saves
(`memory`). The `mok` command is built on them; they need torch only, but for `titan` (torchtitan's debug MoE model
trained with and without mok, which needs torchtitan).
"""
