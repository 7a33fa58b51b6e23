"""The tombstone helper: it fails once the floor passes a shim, and when a probe disagrees."""

from __future__ import annotations

import pytest
from packaging.version import Version

from tests import tombstone
from tests.tombstone import Tombstone


@pytest.fixture
def window(monkeypatch):
    """Pretend the installed vLLM and the declared floor are the given ``major.minor``."""

    def set_window(installed: str, floor: str) -> None:
        monkeypatch.setattr(tombstone, "installed_vllm", lambda: Version(installed))
        monkeypatch.setattr(tombstone, "support_floor", lambda dist: Version(floor))

    return set_window


def test_floor_past_needed_through_names_the_shim(window):
    window(installed="0.33", floor="0.33")
    with pytest.raises(AssertionError, match=r"delete pkg\.compat\.old_api: .*through vLLM 0\.32"):
        Tombstone("pkg.compat.old_api", "dist", needed_through="0.32").check(needed_here=False)


@pytest.mark.parametrize(("installed", "active"), [("0.31", True), ("0.32", True), ("0.33", False)])
def test_probe_agreeing_with_the_record_passes(window, installed, active):
    window(installed=installed, floor="0.31")
    Tombstone("pkg.compat.old_api", "dist", needed_through="0.32").check(needed_here=active)


def test_probe_disagreeing_with_the_record_fails(window):
    window(installed="0.33", floor="0.31")
    with pytest.raises(AssertionError, match=r"pkg\.compat\.old_api: probing vLLM 0\.33 says the workaround is needed"):
        Tombstone("pkg.compat.old_api", "dist", needed_through="0.32").check(needed_here=True)


@pytest.mark.parametrize(("installed", "active"), [("0.31", False), ("0.32", True), ("0.40", True)])
def test_needed_from_covers_behaviour_vllm_introduced(window, installed, active):
    window(installed=installed, floor="0.31")
    Tombstone("pkg.compat.new_behaviour", "dist", needed_from="0.32").check(needed_here=active)
    with pytest.raises(AssertionError, match="vLLM changed this API"):
        Tombstone("pkg.compat.new_behaviour", "dist", needed_from="0.32").check(needed_here=not active)


def test_a_distribution_without_a_floor_is_an_error():
    with pytest.raises(AssertionError, match="no vllm>=X requirement"):
        tombstone.support_floor("pytest")
