"""torchdata 0.9 CSVParser / CSVDictParser docs: binary files, skip_lines, fmtparams, as_tuple."""

import os

from torchdata.datapipes.iter import FileLister, FileOpener


def get_name(path_and_stream):
    return os.path.basename(path_and_stream[0]), path_and_stream[1]


def build(root, base_url):
    tsv = FileOpener(FileLister(f"{root}/csv", "*.tsv"), mode="b").map(get_name)
    csvs = FileOpener(FileLister(f"{root}/csv", "sample_data0.csv"), mode="b").map(get_name)
    return {
        "tuples": tsv.parse_csv(skip_lines=1, delimiter="\t", as_tuple=True, return_path=True),
        "dicts": FileOpener(FileLister(f"{root}/csv", "*.tsv"), mode="b").parse_csv_as_dict(
            skip_lines=1, delimiter="\t", encoding="latin-1"
        ),
        "header_dicts": csvs.parse_csv_as_dict(),
        "lines": FileOpener(FileLister(f"{root}/csv", "*.tsv"), mode="b").readlines(
            skip_lines=1, decode=True, return_path=False
        ),
    }
