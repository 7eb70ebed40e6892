"""The custom-format template runs end to end and its blocks keep the block contract."""

from __future__ import annotations

import copy
import importlib.util
import pathlib

import pytest

from pipeloom import item_rng
from pipeloom.datapipes import IterableWrapper
from pipeloom.testing import (
    check_resume_from_every_step,
    check_same_output_everywhere,
    collect_async,
)

_PATH = pathlib.Path(__file__).parents[2] / "examples" / "custom_record_format.py"
_spec = importlib.util.spec_from_file_location("custom_record_format", _PATH)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


def test_main_reads_the_data_both_ways(tmp_path, capsys):
    summary = example.main(str(tmp_path))
    assert summary["records"] == 12 and summary["first"] == b"shard 0 record 0"
    assert summary["per_worker"] == [8, 4]
    assert summary["random_access"] == [
        b"shard 1 record 3",
        b"shard 1 record 0",
        b"shard 1 record 2",
    ]
    assert "streamed 12 records" in capsys.readouterr().out


def test_stream_reader_resumes_and_survives_copies(tmp_path):
    paths = [str(tmp_path / f"{i}.plr") for i in range(2)]
    for i, path in enumerate(paths):
        example.write_records(path, [bytes([i, j]) for j in range(3)])
    make = lambda: IterableWrapper(paths).read_records()  # noqa: E731
    check_resume_from_every_step(make)
    assert collect_async(copy.deepcopy(make())) == [
        (p, bytes([i, j])) for i, p in enumerate(paths) for j in range(3)
    ]


def test_map_reader_opens_lazily_and_pickles_without_its_file(tmp_path):
    path = str(tmp_path / "m.plr")
    example.write_records(path, [b"a", b"b"])
    dataset = example.RecordDataset(path)
    assert dataset._file is None
    assert dataset[1] == b"b" and dataset._file is not None
    clone = copy.deepcopy(dataset)
    assert clone._file is None and list(clone) == [b"a", b"b"]
    dataset.close()
    clone.close()
    assert dataset._file is None and dataset[0] == b"a"  # re-opened lazily


def test_truncated_file_and_missing_index_are_reported(tmp_path):
    path = tmp_path / "t.plr"
    example.write_records(str(path), [b"abcdef"])
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(ValueError, match=r"t.plr: record at byte 0 is truncated"):
        list(IterableWrapper([str(path)]).read_records())
    with pytest.raises(FileNotFoundError, match=r"needs the index '.*none.plr.idx'"):
        example.RecordDataset(tmp_path / "none.plr")


def record_draw(record):
    return record, float(item_rng().random())


@pytest.mark.timeout(120)
def test_stream_reader_gives_the_same_records_and_draws_under_every_service(tmp_path):
    # It stamps (file position, record index): every service merges its records in
    # the in-process order, with the same item_rng() draws.
    paths = [str(tmp_path / f"{i}.plr") for i in range(3)]
    for i, path in enumerate(paths):
        example.write_records(path, [bytes([i, j]) for j in range(i + 2)])

    def pipeline():
        return IterableWrapper(paths).read_records(return_path=False).map(record_draw).batch(2)

    ran = check_same_output_everywhere(pipeline)
    assert ran == ["in-process", "threads", "classic", "economic", "chunked"]


@pytest.mark.timeout(60)
def test_the_stream_reader_goes_to_forkserver_workers(tmp_path):
    # Python 3.14's default start method on Linux pickles the pipeline: the template's
    # module-level objects must pickle (a struct.Struct did not).
    import pipeloom
    from pipeloom.reading_service import MultiProcessingReadingService

    paths = [str(tmp_path / f"{i}.plr") for i in range(2)]
    for i, path in enumerate(paths):
        example.write_records(path, [bytes([i, j]) for j in range(3)])
    pipe = IterableWrapper(paths).read_records(return_path=False)
    service = MultiProcessingReadingService(2, start_method="forkserver")
    with pipeloom.DataLoader(pipe, service, seed=0) as loader:
        assert sorted(loader) == sorted(bytes([i, j]) for i in range(2) for j in range(3))
