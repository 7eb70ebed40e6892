"""JSON lines (readlines + json.loads) and whole JSON files (torchdata's JsonParser docs)."""

import json
import os

from torchdata.datapipes.iter import FileLister, FileOpener, IterableWrapper


def get_name(path_and_stream):
    return os.path.basename(path_and_stream[0]), path_and_stream[1]


def build(root, base_url):
    lines = FileOpener(FileLister(f"{root}/json", "*.jsonl"), mode="rt")
    records = lines.readlines(return_path=False).map(json.loads).filter(lambda r: r["label"] != 0)
    datapipe1 = IterableWrapper([f"{root}/json/1.json", f"{root}/json/2.json"])
    datapipe2 = FileOpener(datapipe1, mode="b")
    datapipe3 = datapipe2.map(get_name)
    json_dp = datapipe3.parse_json_files()
    return {
        "records": records.map(lambda r: (r["id"], r["text"])),
        "batched": FileOpener(FileLister(f"{root}/json", "*.jsonl"))
        .readlines(return_path=False)
        .map(json.loads)
        .batch(4)
        .rows2columnar(["id", "label"]),
        "documents": json_dp,
    }
