"""mok: a deterministic mixture-of-experts layer.

`mok.MoE` (the module; also `mok.Routing`, `mok.RouterLosses`) and `mok.moe` / `mok.router` /
`mok.router_losses` (the functional ops) are imported on first use. Import the subpackages explicitly:
`mok.reference` (the bit-exact contract), `mok.fast` (CUDA, Hopper), `mok.nn`, `mok.hf`, `mok.testing`
(bitwise comparisons, seeded inputs) and `mok.cli` (the `mok` command: goldens, verify, diff-grads; its extra:
`pip install "mok[harness]"`).
"""

__version__ = "0.3.0"

_LAZY = {"MoE": "mok.nn", "RouterLosses": "mok.nn", "Routing": "mok.nn",
         "moe": "mok.nn.ops", "router": "mok.nn.ops", "router_losses": "mok.nn.ops"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mok' has no attribute {name!r}")
