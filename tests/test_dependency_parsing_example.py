"""examples/dependency_parsing.py end to end on a few sentences (one epoch), and its tree checks."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

try:
    metadata.distribution("turkish-treebanks")
except metadata.PackageNotFoundError:
    pytest.skip("needs the demo corpus: pip install -e '.[demo]'", allow_module_level=True)

sys.path.insert(0, str(EXAMPLES))  # the example imports its sibling treebank.py, as when run as a script
import dependency_parsing  # noqa: E402


def test_tree_checks():
    assert dependency_parsing.is_well_formed([2, 0, 2])
    assert not dependency_parsing.is_well_formed([0, 0, 2])  # two roots
    assert not dependency_parsing.is_well_formed([2, 1, 0])  # a cycle 1 <-> 2
    assert not dependency_parsing.is_well_formed([2, 3, 1])  # no root at all
    assert dependency_parsing.is_projective([2, 0, 2])
    assert not dependency_parsing.is_projective([3, 4, 0, 3])  # 3 -> 1 crosses 4 -> 2
    assert not dependency_parsing.is_projective([0, 4, 1, 1])  # 4 -> 2 crosses 1 -> 3
    assert not dependency_parsing.is_projective([3, 0, 2])  # 3 -> 1 crosses the root's arc to 2
    assert dependency_parsing.to_arc_layout([2, 0, 2]) == [1, 1, 1]  # word 1 (index 1): the diagonal
    assert dependency_parsing.to_conll([1, 1, 1]) == [2, 0, 2]


def test_main_on_a_few_sentences(capsys):
    args = ["--epochs", "1", "--max-train", "24", "--max-eval", "40", "--batch-size", "8", "--hidden", "32"]
    results = dependency_parsing.main([*args, "--device", "cpu"])
    out = capsys.readouterr().out
    assert set(results) == {"tree CRF (DependencyCRF)", "head selection (softmax)"}
    for scores in results.values():
        assert set(scores) == {"uas", "las", "well_formed", "projective"}
        assert all(0.0 <= v <= 1.0 for v in scores.values())
        assert scores["las"] <= scores["uas"] and scores["projective"] <= scores["well_formed"]
    crf = results["tree CRF (DependencyCRF)"]
    assert crf["well_formed"] == 1.0 and crf["projective"] == 1.0  # Eisner's argmax: a projective tree, one root
    assert "training on 24 sentences" in out and "test set (40 sentences" in out
