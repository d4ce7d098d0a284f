"""The `mok` command: `mok verify`, `mok golden check|regen`, `mok diff-grads` (entry point: `mok.cli.main.main`).

Needs the `harness` extra (safetensors, tqdm, numpy). The helpers it shares with tests live in `mok.testing`.
"""
