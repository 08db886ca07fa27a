"""The runtime runs in training images that have torch and the storage SDK but no azure-cli."""
import subprocess
import sys
import textwrap


def test_runtime_imports_without_azure_cli_or_knack():
    code = textwrap.dedent("""
        import importlib.abc, sys

        class NoAzureCli(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] == "knack" or name.startswith("azure.cli"):
                    raise ImportError(f"{name} is not installed in training images")
                return None

        sys.meta_path.insert(0, NoAzureCli())
        from azext_elastictrain.runtime import Checkpointer, TrainingState  # noqa: F401
        import azext_elastictrain.runtime.preemption, azext_elastictrain.core.catalog  # noqa: F401
        assert not any(m == "knack" or m.startswith("azure.cli") for m in sys.modules), "az leaked in"
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
