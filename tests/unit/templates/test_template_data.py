"""The template data loader: dense CSV and sparse LibSVM read right, and every malformed file named by line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dlcloud.templates.data import DataError, find_file, load, read_csv, read_libsvm


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_csv_reads_features_and_label_column(tmp_path: Path) -> None:
    path = _file(tmp_path, "t.csv", "a,y,b\n1,yes,2\n\n3.5,no,-4e-1\n")
    table = read_csv(path, "y")
    assert table.feature_names == ["a", "b"]
    assert table.labels == ["yes", "no"]
    assert table.lines == [2, 4]
    np.testing.assert_allclose(table.features, [[1, 2], [3.5, -0.4]])


def test_csv_label_defaults_to_the_last_column(tmp_path: Path) -> None:
    table = read_csv(_file(tmp_path, "t.csv", "a,b,target\n1,2,0\n"))
    assert table.labels == ["0"] and table.feature_names == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "label", "message"),
    [
        ("a,b,c,y\n1,2,3,0\n1,2,0\n", "y", "t.csv line 3: 3 columns, the header has 4"),
        ("a,y\n1,0\n2,1\nabc,1\n", "y", "t.csv line 4: 'abc' is not a number (column a)"),
        ("a,y\n1,0\nnan,1\n", "y", "t.csv line 3: 'nan' is not a finite number (column a)"),
        ("a,y\n1,\n", "y", "t.csv line 2: the label (y) is empty"),
        ("a,b\n1,0\n", "y", "t.csv line 1: the header has no column 'y'; its columns: a, b"),
        ("", "y", "t.csv: the file is empty"),
        ("a,y\n", "y", "the header is there but no rows follow"),
    ],
)
def test_malformed_csv_names_the_line(tmp_path: Path, text: str, label: str, message: str) -> None:
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_csv(_file(tmp_path, "t.csv", text), label)


def test_libsvm_is_densified_to_the_highest_index(tmp_path: Path) -> None:
    path = _file(tmp_path, "t.libsvm", "# a comment\n+1 1:0.5 3:2\n-1 qid:3 2:1  # trailing\n\n")
    table = read_libsvm(path)
    assert table.labels == ["+1", "-1"] and table.lines == [2, 3]
    np.testing.assert_allclose(table.features, [[0.5, 0, 2], [0, 1, 0]])
    assert read_libsvm(path, num_features=5).features.shape == (2, 5)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1 1:1\n0 2:1\n1 1:1\n1 0:3\n", "t.svm line 4: index 0 (indices start at 1)"),
        ("1 1:1\n1 2\n", "t.svm line 2: '2' is not INDEX:VALUE"),
        ("1 x:1\n", "t.svm line 1: index 'x' is not an integer"),
        ("1 1:abc\n", "t.svm line 1: 'abc' is not a number (index 1)"),
        ("yes 1:1\n", "t.svm line 1: 'yes' is not a number (the label)"),
        ("1 2:1 2:3\n", "t.svm line 1: index 2 appears twice"),
        ("1 9:1\n", "t.svm line 1: index 9 is above num_features (4)"),
        ("# nothing\n", "t.svm: no rows"),
    ],
)
def test_malformed_libsvm_names_the_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_libsvm(_file(tmp_path, "t.svm", text), num_features=4 if "9:1" in text else None)


def test_find_file_takes_the_only_file_or_the_named_one(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    only = _file(tmp_path / "d", "x.csv", "a,y\n1,0\n")
    assert find_file(tmp_path / "d", None) == only
    _file(tmp_path / "d", "z.csv", "a,y\n1,0\n")
    with pytest.raises(DataError, match=r"holds 2 files \(x.csv, z.csv\); name one"):
        find_file(tmp_path / "d", None)
    assert find_file(tmp_path / "d", "z.csv").name == "z.csv"
    with pytest.raises(DataError, match="no file 'w.csv'"):
        find_file(tmp_path / "d", "w.csv")


def test_load_refuses_an_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="data format must be one of csv, libsvm"):
        load(_file(tmp_path, "t.csv", "a,y\n1,0\n"), "parquet")
