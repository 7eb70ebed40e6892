"""torchdata 0.9 TFRecordLoader docs: Examples and SequenceExamples, with and without a spec."""

import torch
from torchdata.datapipes.iter import FileLister, FileOpener


def build(root, base_url):
    examples = FileOpener(FileLister(f"{root}/tfrecord", "examples.tfrecord"), mode="b")
    sequences = FileOpener(FileLister(f"{root}/tfrecord", "sequences.tfrecord"), mode="b")
    spec = {
        "pixels": ((2, 3), torch.float64),
        "label": ((), torch.int64),
        "name": ((2,), None),
    }
    return {
        "examples": examples.load_from_tfrecord().map(lambda e: sorted(e.items())),
        "with_spec": FileOpener(FileLister(f"{root}/tfrecord", "examples.tfrecord"), mode="b")
        .load_from_tfrecord(spec)
        .map(lambda e: sorted(e.items())),
        "sequences": sequences.load_from_tfrecord().map(lambda e: sorted(e.items())),
        "sequences_spec": FileOpener(FileLister(f"{root}/tfrecord", "sequences.tfrecord"), mode="b")
        .load_from_tfrecord({"length": ((), torch.int64), "frames": ((-1, 2), torch.float32)})
        .map(lambda e: sorted(e.items())),
    }
