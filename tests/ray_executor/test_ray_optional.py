"""Ray is optional: accord imports without it, and choosing the ray executor without it
installed says how to install it (these run in the default suite, Ray or not)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from accord.core.config import EngineConfig
from accord.core.executor import executor_class


@pytest.mark.slow
def test_accord_and_the_ray_executor_module_import_without_ray() -> None:
    script = (
        "import sys; sys.modules['ray'] = None\n"
        "import accord, accord.entrypoints, accord.core.executor.ray\n"
        "print('imported')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "imported" in result.stdout, result.stderr


def test_choosing_ray_without_ray_installed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` fail as if absent
    config = EngineConfig(model="unused", tensor_parallel_size=2, distributed_executor_backend="ray")

    def no_backend() -> None:
        raise AssertionError("the executor must stop before it builds anything")

    with pytest.raises(ImportError, match=r"pip install 'accord\[ray\]'"):
        executor_class("ray")(config, no_backend)
