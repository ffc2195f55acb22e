"""The road of every lookup makes no closure cells. CPython 3.11 makes a cell for each variable a
nested function shares, at every call of the function that holds it, whether or not the nested
function is ever made. ``Tree.find`` made five that way (for its read of the database), a
fifth of what the shorter road took off a lookup answered from a held folder in-process (0.2 of 0.6
us). On this road each microsecond before the reply counts several times over through a mount
(docs/performance.md, "Cold `stat`: a shorter road to the reply"), so a nested function here
belongs in a method of its own."""

from __future__ import annotations

import types

import pytest

from zarrfs.fs.api import Operations
from zarrfs.fs.foldercache import FolderCache
from zarrfs.fs.handles import HandleTable
from zarrfs.fs.lookups import Lookups
from zarrfs.fs.tree import Tree
from zarrfs.fuse.dispatch import Dispatcher
from zarrfs.fuse.inodes import InodeTable
from zarrfs.fuse.session import Session

ROAD = [
    Dispatcher.handle,
    Session._lookup,
    Session._entry,
    Session._getattr,
    Operations.find,
    HandleTable.pending,
    Tree.find,
    FolderCache.answer,
    Lookups.remember,
    InodeTable.key,
    InodeTable.remember_plain,
    InodeTable._new,
]


@pytest.mark.parametrize("function", ROAD, ids=lambda f: f.__qualname__)
def test_the_lookup_road_makes_no_cells(function):
    if not isinstance(function, types.FunctionType):  # a compiled build: no frames to speak of
        pytest.skip("compiled")
    assert function.__code__.co_cellvars == (), (
        f"{function.__qualname__} shares {function.__code__.co_cellvars} with a nested function:"
        " move that function to a method of its own"
    )


def test_a_closure_in_a_function_makes_its_cells_at_every_call():
    """What the test above guards against, shown: the cells are there before any branch runs."""

    def find(key, remote):
        if remote:
            return lambda: key
        return key

    assert find.__code__.co_cellvars == ("key",)
