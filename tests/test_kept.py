"""``Kept``: a memo that never holds more than its size."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from guidedec.kept import Kept


@given(st.integers(1, 8), st.lists(st.tuples(st.integers(0, 20), st.integers())))
def test_holds_at_most_its_size_and_the_last_value_put(
    size: int, puts: list[tuple[int, int]]
) -> None:
    kept: Kept[int, int] = Kept(size)
    for key, value in puts:
        assert kept.put(key, value) == value
        assert len(kept) <= size
        assert key in kept and kept.get(key) == value


def test_a_new_key_past_the_size_forgets_the_others_a_known_one_does_not() -> None:
    kept: Kept[str, int] = Kept(2)
    kept.put("a", 1)
    kept.put("b", 2)
    kept.put("a", 3)  # known: nothing forgotten
    assert kept.get("b") == 2 and kept.get("a") == 3
    kept.put("c", 4)
    assert len(kept) == 1 and kept.get("a") is None and kept.get("c") == 4


def test_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="size must be at least 1, got 0"):
        Kept(0)
