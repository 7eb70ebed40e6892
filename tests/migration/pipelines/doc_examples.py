"""The examples of torchdata 0.9's documentation for single blocks, run as written."""

import os
from operator import itemgetter

from torchdata.datapipes.iter import IterableWrapper
from torchdata.datapipes.map import SequenceWrapper


def group_fn(file):
    return os.path.basename(file).split(".")[0]


def merge_fn(tuple_from_iter, value_from_map):
    return tuple_from_iter[0], tuple_from_iter[1] + value_from_map


def build(root, base_url):
    files = IterableWrapper(["a.png", "b.png", "a.json", "b.json", "a.jpg", "c.json"])
    rows = IterableWrapper([(0, 10, 100), (1, 11, 111), (2, 12, 122), (3, 13, 133), (4, 14, 144)])
    nested = IterableWrapper([(0, 10, (100, 1000)), (1, 11, (111, 1001)), (2, 12, (122, 1002))])
    first, second, third = IterableWrapper([(i, i + 10, i + 20) for i in range(3)]).unzip(
        sequence_length=3
    )
    dp1, dp2 = IterableWrapper(range(5)).round_robin_demux(2)
    train, valid = IterableWrapper(range(10)).random_split(
        total_length=10, weights={"train": 0.5, "valid": 0.5}, seed=0
    )
    uneven, rest = IterableWrapper(range(50)).random_split(
        weights={"a": 3, "b": 1.5}, seed=123, total_length=50
    )
    dp_a = IterableWrapper([("a", 100), ("b", 200), ("c", 300)])
    dp_b = IterableWrapper([("a", 1), ("b", 2), ("c", 3), ("d", 4)])
    return {
        "groupby": files.groupby(group_key_fn=group_fn),
        "groupby_size": files.groupby(group_key_fn=group_fn, group_size=2),
        "groupby_buffer": files.groupby(
            group_key_fn=group_fn, buffer_size=3, group_size=3, guaranteed_group_size=2
        ),
        "groupby_keep_key": files.groupby(group_key_fn=group_fn, keep_key=True),
        "zip_with_iter": dp_a.zip_with_iter(
            dp_b,
            key_fn=itemgetter(0),
            ref_key_fn=itemgetter(0),
            keep_key=True,
            merge_fn=lambda t1, t2: t1[1] + t2[1],
        ),
        "zip_with_map": IterableWrapper([("a", 1), ("b", 2), ("c", 3)]).zip_with_map(
            map_datapipe=SequenceWrapper({"a": 100, "b": 200, "c": 300, "d": 400}),
            key_fn=itemgetter(0),
            merge_fn=merge_fn,
        ),
        "unzip": [first, second, third],
        "round_robin_demux": [dp1, dp2],
        "random_split": [train, valid],
        "random_split_uneven": [uneven, rest],
        "slice": rows.slice(0, 2),
        "slice_list": rows.slice([0, 2]),
        "drop": rows.drop(1),
        "drop_list": rows.drop([0, 2]),
        "flatten": nested.flatten(2),
        "flatten_all": IterableWrapper([(0, (1, 2)), (3, (4, 5)), (6, (7, 8))]).flatten(),
        "flatten_dict": IterableWrapper([{"a": 1, "b": {"c": 2, "d": 3}}]).flatten("b"),
        "repeat": IterableWrapper(range(3)).repeat(2),
        "shard_expand": IterableWrapper(["ds-{00..05}.tar", "ds-{8..11}.tar"]).shard_expand(),
        "rows2columnar": IterableWrapper(
            [[{"a": 1}, {"b": 2, "a": 1}], [{"a": 1, "b": 200}, {"b": 2, "c": 3, "a": 100}]]
        ).rows2columnar(),
        "rows2columnar_names": IterableWrapper([[[0, 1, 2, 3], [4, 5, 6, 7]]]).rows2columnar(
            column_names=["1st_in_batch", "2nd_in_batch", "3rd_in_batch", "4th_in_batch"]
        ),
        "add_index": IterableWrapper([{"a": 1, "b": 2}, {"c": 3, "a": 1}]).add_index("order"),
        "map_batches": IterableWrapper(list(range(5))).map_batches(
            lambda batch: [d + 1 for d in batch], batch_size=3
        ),
        "map_batches_col": IterableWrapper([(i, str(i)) for i in range(5)]).map_batches(
            lambda batch: [len(batch)] * len(batch), batch_size=2, input_col=1
        ),
        "set_length": IterableWrapper(range(10)).filter(lambda x: x < 5).set_length(3),
        "lines_to_paragraphs": IterableWrapper(
            [
                ("file1", "Line1"),
                ("file1", "Line2"),
                ("file2", "Line2,1"),
                ("file2", "Line2,2"),
                ("file2", "Line2,3"),
            ]
        ).lines_to_paragraphs(joiner=lambda ls: " ".join(ls)),
        "header": IterableWrapper(range(10)).header(3),
        "enumerate": IterableWrapper(["a", "b", "c"]).enumerate(starting_index=5),
        "cycle": IterableWrapper(range(3)).cycle(2),
        "unbatch": IterableWrapper([[[0, 1], [2]], [[3, 4], [5]], [[6]]]).unbatch(unbatch_level=2),
        "batch": IterableWrapper(range(10)).batch(batch_size=3, drop_last=True),
        "flatmap": IterableWrapper(list(range(5))).flatmap(lambda e: [e, e * 10]),
        "zip": IterableWrapper(range(5)).zip(IterableWrapper(range(10, 15))),
        "concat": IterableWrapper(range(3)).concat(IterableWrapper(range(5))),
        "mux": IterableWrapper(range(3)).mux(
            IterableWrapper(range(10, 15)), IterableWrapper(range(20, 25))
        ),
        "demux": IterableWrapper(range(5)).demux(2, lambda x: x % 2),
        "fork": IterableWrapper(range(5)).fork(num_instances=2),
        "map_cols": IterableWrapper([(0, 1), (2, 3)]).map(
            lambda x: x * 10, input_col=1, output_col=-1
        ),
        "filter_col": IterableWrapper([(0, 1), (2, 3)]).filter(lambda x: x > 1, input_col=1),
        "collate": IterableWrapper([[1, 2], [3, 4]]).collate(),
        "map_style_batch": SequenceWrapper(range(10)).batch(batch_size=4).to_iter_datapipe(),
        "map_style_zip": SequenceWrapper(range(3))
        .zip(SequenceWrapper(range(10, 13)))
        .to_iter_datapipe(),
        "map_style_unzip": [
            part.to_iter_datapipe()
            for part in SequenceWrapper([(i, i + 1) for i in range(3)]).unzip(sequence_length=2)
        ],
    }
