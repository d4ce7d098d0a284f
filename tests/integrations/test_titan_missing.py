"""Without torchtitan, importing mok.titan says what to install (mok itself imports without it)."""
import subprocess
import sys

_BLOCK_TORCHTITAN = r"""
import sys
class _NoTorchtitan:
    def find_spec(self, name, path=None, target=None):
        if name == "torchtitan" or name.startswith("torchtitan."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoTorchtitan())
import mok  # the package does not need torchtitan
try:
    import mok.titan
except ImportError as e:
    print("ImportError:", e)
else:
    print("imported")
"""


def test_import_without_torchtitan_names_the_package_to_install():
    r = subprocess.run([sys.executable, "-c", _BLOCK_TORCHTITAN], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("ImportError: mok.titan needs torchtitan >= 0.3.0 (pip install torchtitan)"), r.stdout
