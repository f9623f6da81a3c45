"""Tests that read the shared data skip where it is absent, and fail where CI requires it."""

from __future__ import annotations

import pytest

from conftest import DATA, REQUIRE_DATA_ENV, data_params, missing_data, pytest_runtest_setup


def test_missing_data_skips_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUIRE_DATA_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="shared test data not found"):
        missing_data(DATA / "no-such-file")


def test_missing_data_fails_where_ci_requires_the_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_DATA_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=r"no-such-file .*GUIDEDEC_REQUIRE_DATA=1"):
        missing_data(DATA / "no-such-file")


def test_parameters_from_absent_data_are_one_data_case_not_an_empty_list() -> None:
    (case,) = data_params([], "no-such-dir", "cases.json")
    assert case.id == "missing-data"
    (marker,) = case.marks
    assert marker.name == "data" and marker.args == ("no-such-dir/cases.json",)
    assert data_params([1, 2], "no-such-dir", "cases.json") == [1, 2]


class _Item:
    """What the setup hook reads of a test item: its markers."""

    def __init__(self, *marks: pytest.MarkDecorator) -> None:
        self.marks = [mark.mark for mark in marks]

    def iter_markers(self, name: str) -> list[pytest.Mark]:
        return [mark for mark in self.marks if mark.name == name]


def test_the_setup_hook_stops_a_data_test_whose_data_is_absent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(REQUIRE_DATA_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="no-such-dir"):
        pytest_runtest_setup(_Item(pytest.mark.data("no-such-dir/cases.json")))  # type: ignore[arg-type]
    pytest_runtest_setup(_Item(pytest.mark.slow))  # type: ignore[arg-type]  # not a data test
    if DATA.is_dir():  # the plain marker asks for the data folder itself
        pytest_runtest_setup(_Item(pytest.mark.data))  # type: ignore[arg-type]
