"""Cgroup tree handling that does not need a cgroup hierarchy: the walk and the removal order."""

from __future__ import annotations

from pathlib import Path

from dressage.paddock.cgroups import Cgroup, _subgroups


def test_subgroups_are_listed_deepest_first(tmp_path: Path) -> None:
    for sub in ("exec-0/inner", "exec-1"):
        (tmp_path / sub).mkdir(parents=True)
    found = _subgroups(tmp_path)
    assert set(found) == {tmp_path / "exec-0", tmp_path / "exec-0/inner", tmp_path / "exec-1"}
    assert found.index(tmp_path / "exec-0/inner") < found.index(tmp_path / "exec-0")


def test_a_group_that_vanished_is_no_error(tmp_path: Path) -> None:
    # An exec's own cleanup may remove its group while terminate walks the tree.
    gone = tmp_path / "exec-3"
    assert _subgroups(gone) == []
    group = Cgroup([gone], version=1)
    assert group.pids() == set()
    group.remove()  # nothing left to remove: returns quietly


def test_remove_deletes_children_before_parents(tmp_path: Path) -> None:
    root = tmp_path / "sandbox"
    (root / "exec-0" / "inner").mkdir(parents=True)
    (root / "exec-1").mkdir()
    Cgroup([root], version=1).remove()
    assert not root.exists()
