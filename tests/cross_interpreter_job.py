"""What one interpreter makes of many pipelines, for ``test_cross_interpreter.py``.

python cross_interpreter_job.py ROOT OUT

Each interpreter has its own string-hash seed (``PYTHONHASHSEED``), so set
order and ``hash(str)`` differ between runs and between a process and its
spawned workers. For every pipeline of :func:`build` this writes to OUT (JSON)
its items, its fingerprint (``pipeloom._fingerprint``), the ranks' digest
(``pipeloom._rank_pipelines``), its snapshot-cache fingerprint and a loader
state after 3 items (a pickle, for another interpreter to resume), plus the
items of two pipelines read by 2 spawned workers, whose hash seed the job sets
apart from its own. ROOT holds the tar shards of :func:`write_shards`.
"""

from __future__ import annotations

import base64
import functools
import io
import json
import operator
import os
import pickle
import sys
import tarfile
from typing import Any

from pipeloom import DataLoader
from pipeloom._fingerprint import pipeline_fingerprint
from pipeloom._rank_pipelines import digest, rank_description
from pipeloom.datapipes import FileLister, IterableWrapper, item_rng
from pipeloom.datapipes import fingerprint as cache_fingerprint
from pipeloom.reading_service import MultiProcessingReadingService

WORDS = [f"{c}{i}" for i in range(9) for c in ("ant", "bee", "cat", "dog")]
TAGS = frozenset({"ant", "bee", "cat", "dog", "elk", "fox"})  # iterated: order is per process


def write_shards(root: str) -> None:
    """3 tar shards of 4 samples (.txt, .cls, .json members), written in unsorted order."""
    for shard in (2, 0, 1):
        with tarfile.open(os.path.join(root, f"shard-{shard}.tar"), "w") as tar:
            for sample in range(4):
                for ext in ("txt", "cls", "json"):
                    data = f"{shard}/{sample}/{ext}".encode()
                    info = tarfile.TarInfo(f"s{shard}_{sample}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def animal(word: str) -> str:
    return word.rstrip("0123456789")


def animal_index(word: str) -> int:
    return sorted(TAGS).index(animal(word)) % 3


def jitter(x: Any) -> tuple[Any, int]:
    return (x, int(item_rng().integers(1000)))


def text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return (value if isinstance(value, bytes) else value.read()).decode()


def sample_summary(sample: dict[str, Any]) -> list[Any]:
    return [[key, text(value)] for key, value in sample.items() if key != "__url__"]


def first_of(pair: tuple[Any, Any]) -> Any:
    return pair[0]


class Tagger:
    """A callable object of ``__main__`` holding a set of strings."""

    def __init__(self) -> None:
        self.tags = set(TAGS)
        self.scale = {"ant": 1, "bee": 2}

    def __call__(self, word: str) -> tuple[str, bool]:
        return (word, animal(word) in self.tags)

    def length(self, word: str) -> tuple[str, int]:
        return (word, len(word))


def build(name: str, root: str) -> Any:
    words = IterableWrapper(WORDS)
    if name == "groupby":
        return (
            words.shuffle()
            .sharding_filter()
            .map(jitter)
            .groupby(lambda pair: animal(pair[0]), buffer_size=6, group_size=3, drop_remaining=True)
        )
    if name == "demux":
        a, b, c = words.shuffle().demux(3, animal_index)
        return a.zip(b, c).map(jitter)
    if name == "random_split":
        weights = {tag: 1.0 for tag in sorted(TAGS)}
        return words.random_split(weights, seed=3, total_length=len(WORDS), target="cat")
    if name == "mux":
        return words.mux(
            IterableWrapper(WORDS).map(str.upper), weights=[0.3, 0.7], sampling="random"
        )
    if name == "bucketbatch":
        return words.bucketbatch(4, batch_num=3, sort_key=sorted)
    if name == "key_zip":
        table = IterableWrapper([(tag, i) for i, tag in enumerate(sorted(TAGS))]).to_map_datapipe()
        return words.shuffle().zip_with_map(table, animal)
    if name == "callables":
        tagger = Tagger()
        return (
            words.map(tagger)
            .map(first_of)
            .map(functools.partial(operator.add, "x"))
            .filter(lambda w: len(w) > 0)
            .map(tagger.length)
            .batch(5)
            .in_batch_shuffle()
        )
    if name == "webdataset":
        return (
            FileLister(root, masks="*.tar")
            .shuffle()
            .sharding_filter()
            .open_files("b")
            .load_from_tar()
            .webdataset()
            .map(sample_summary)
        )
    if name == "set_source":  # a set of strings iterates in another order in each process
        return IterableWrapper(set(WORDS)).sharding_filter().map(jitter)
    if name == "list_files":
        return IterableWrapper([root]).list_files(recursive=True).map(os.path.basename)
    raise ValueError(f"no pipeline {name!r}")


NAMES = (
    "groupby",
    "demux",
    "random_split",
    "mux",
    "bucketbatch",
    "key_zip",
    "callables",
    "webdataset",
    "list_files",
    "set_source",
)
SPAWNED = ("webdataset", "set_source")  # also read by 2 spawned workers (blocks run there)
SEED = 11


def report_hash(worker_id: int) -> None:
    """worker_init_fn: leave this worker's hash of a string where the job reads it."""
    path = os.path.join(os.environ["CROSS_INTERPRETER_OUT"], f"worker-{worker_id}.hash")
    with open(path, "w") as file:
        file.write(str(hash("pipeloom")))


def describe(name: str, root: str) -> dict[str, Any]:
    pipeline = build(name, root)
    loader = DataLoader(pipeline, seed=SEED)
    items = iter(loader)
    first = [next(items) for _ in range(3)]
    state = loader.state_dict()
    rest = list(items)
    return {
        "items": repr(first + rest),
        "rest": repr(rest),
        "fingerprint": json.dumps(pipeline_fingerprint(pipeline), sort_keys=True),
        "rank_digest": digest(rank_description(build(name, root), False)),
        "cache_fingerprint": cache_fingerprint(build(name, root)).digest,
        "state": base64.b64encode(pickle.dumps(state)).decode(),
    }


def main(root: str, out: str) -> None:
    report: dict[str, Any] = {"hash": hash("pipeloom"), "pipelines": {}, "spawned": {}}
    for name in NAMES:
        report["pipelines"][name] = describe(name, root)
    os.environ["CROSS_INTERPRETER_OUT"] = os.path.dirname(out)
    os.environ["PYTHONHASHSEED"] = str(int(os.environ["PYTHONHASHSEED"]) + 100)  # the workers'
    for name in SPAWNED:
        service = MultiProcessingReadingService(
            2, start_method="spawn", worker_init_fn=report_hash, timeout=60
        )
        report["spawned"][name] = repr(list(DataLoader(build(name, root), service, seed=SEED)))
    report["worker_hashes"] = [
        int(open(os.path.join(os.path.dirname(out), f"worker-{i}.hash")).read()) for i in range(2)
    ]
    with open(out, "w") as file:
        json.dump(report, file, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
