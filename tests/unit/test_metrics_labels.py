"""Label values a host chooses: printable, short, and at most so many series."""

from __future__ import annotations

import pytest

from pynvmf.metrics.labels import MAX_LABEL_CHARS, OTHER, BoundedLabels, label_value


def test_a_legitimate_nqn_is_its_own_label() -> None:
    nqn = "nqn.2014-08.org.nvmexpress:uuid:" + "a" * 36
    assert label_value(nqn) == nqn


def test_control_characters_and_lone_surrogates_become_question_marks() -> None:
    assert label_value('a\nb\x00c"d\\e\udcff') == 'a?b?c"d\\e?'


def test_a_huge_value_is_cut_and_two_that_share_a_prefix_stay_apart() -> None:
    one, two = "x" * 5000 + "1", "x" * 5000 + "2"
    assert len(label_value(one)) == MAX_LABEL_CHARS
    assert label_value(one) != label_value(two)
    assert label_value(one).startswith("x" * 200)


def test_values_past_the_limit_fold_into_other_and_are_counted() -> None:
    labels = BoundedLabels(limit=3)
    got = labels.assign(["h5", "h1", "h4", "h2", "h3"])
    assert got == {"h1": "h1", "h2": "h2", "h3": "h3", "h4": OTHER, "h5": OTHER}
    assert labels.folded == 2


def test_a_kept_value_keeps_its_series_and_a_gone_one_gives_its_place_up() -> None:
    labels = BoundedLabels(limit=2)
    labels.assign(["b", "c"])
    # "a" sorts first but comes later: b and c keep their series while present.
    assert labels.assign(["a", "b", "c"]) == {"a": OTHER, "b": "b", "c": "c"}
    assert labels.assign(["a", "c"]) == {"a": "a", "c": "c"}
    assert labels.folded == 0


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        BoundedLabels(limit=0)
