"""JsonParser (parse_json_files): one JSON document per file."""

from __future__ import annotations

import io
import json
from decimal import Decimal

import pytest

from pipeloom.datapipes import FileLister, IterableWrapper, JsonParser
from pipeloom.testing import check_resume_from_every_step
from tests.datapipes.everywhere import check_same_output_everywhere


@pytest.fixture
def docs(tmp_path):
    for index in range(5):
        (tmp_path / f"{index}.json").write_text(json.dumps({"id": index, "x": [index, 1.5]}))
    return tmp_path


def test_parses_each_file_and_closes_it(docs):
    opener = FileLister(docs, "*.json").open_files("rb")
    parsed = list(opener.parse_json_files())
    assert [doc for _, doc in parsed] == [{"id": i, "x": [i, 1.5]} for i in range(5)]
    assert parsed[0][0] == str(docs / "0.json")
    assert all(stream.closed for _, _, stream in opener._handed)


def test_passes_keyword_arguments_to_json_loads_and_takes_bytes_items():
    files = IterableWrapper([("a.json", b'{"v": 0.1}'), ("b.json", io.StringIO("[2.5]"))])
    assert list(files.parse_json_files(parse_float=Decimal)) == [
        ("a.json", {"v": Decimal("0.1")}),
        ("b.json", [Decimal("2.5")]),
    ]
    assert repr(JsonParser(files, parse_float=Decimal)) == (
        "JsonParser(parse_float=<class 'decimal.Decimal'>)"
    )


def test_errors_name_the_file_and_the_fix():
    with pytest.raises(json.JSONDecodeError) as caught:
        list(IterableWrapper([("bad.json", io.StringIO("{nope"))]).parse_json_files())
    assert "while parsing the JSON file 'bad.json'" in "\n".join(caught.value.__notes__)
    with pytest.raises(TypeError, match=r"json\.loads, which rejects \['colour'\]"):
        IterableWrapper([]).parse_json_files(colour=True)
    with pytest.raises(TypeError, match=r"expects \(path, stream\) items, got str"):
        list(IterableWrapper(["a.json"]).parse_json_files())
    with pytest.raises(TypeError, match="expects a stream or bytes for 'a.json', got int"):
        list(IterableWrapper([("a.json", 3)]).parse_json_files())


def test_length_follows_the_source():
    assert len(IterableWrapper([("a", "1"), ("b", "2")]).parse_json_files()) == 2


def test_resume_from_every_step(docs):
    check_resume_from_every_step(
        lambda: FileLister(docs, "*.json").open_files().parse_json_files().batch(2)
    )


def test_same_output_everywhere(docs):
    epochs = check_same_output_everywhere(
        lambda: (
            FileLister(docs, "*.json").shuffle().sharding_filter().open_files().parse_json_files()
        )
    )
    assert sorted(doc["id"] for _, doc in epochs[0]) == list(range(5))
