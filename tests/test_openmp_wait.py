"""`import accord` shortens libgomp's spin-wait before torch loads it, and never over the
user's own OpenMP wait settings or once torch is imported (when it would be too late)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from accord._openmp_wait import SPIN_COUNT

PRINT_SPIN = "import os; print(os.environ.get('GOMP_SPINCOUNT'))"


def spin_count_after(code: str, **env: str) -> str:
    """GOMP_SPINCOUNT as a fresh interpreter running `code` sees it, with `env` set."""
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    result = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                            check=True)
    return result.stdout.strip()


def test_import_accord_sets_the_short_spin_before_torch_loads() -> None:
    assert spin_count_after(f"import accord; {PRINT_SPIN}") == str(SPIN_COUNT)
    # The value reaches torch's OpenMP runtime: it is loaded after accord set it.
    assert spin_count_after(f"import accord, torch; torch.ones(1); {PRINT_SPIN}") == str(SPIN_COUNT)


@pytest.mark.parametrize("setting", [{"GOMP_SPINCOUNT": "5"}, {"OMP_WAIT_POLICY": "ACTIVE"}])
def test_a_users_openmp_wait_setting_is_kept(setting: dict[str, str]) -> None:
    expected = setting.get("GOMP_SPINCOUNT", "None")
    assert spin_count_after(f"import accord; {PRINT_SPIN}", **setting) == expected


def test_nothing_is_set_once_torch_is_imported() -> None:
    # libgomp has read its settings by then; setting the variable would only mislead.
    assert spin_count_after(f"import torch, accord; {PRINT_SPIN}") == "None"


def test_peers_get_their_own_spin_back_but_keep_a_users() -> None:
    ours = f"import accord; from accord._openmp_wait import peer_environment; print(peer_environment().get('GOMP_SPINCOUNT'))"
    assert spin_count_after(ours) == "None"
    assert spin_count_after(ours, GOMP_SPINCOUNT="7") == "7"
