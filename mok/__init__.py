"""mok: a deterministic mixture-of-experts layer. `mok.MoE` is imported on first use."""


def __getattr__(name):
    if name in ("MoE", "RouterLosses", "Routing"):
        from . import nn

        return getattr(nn, name)
    raise AttributeError(f"module 'mok' has no attribute {name!r}")
