"""torchdata 0.9 HttpReader docs: files streamed over HTTP, checked, parsed."""

from torchdata.datapipes.iter import FileOpener, HttpReader, IterableWrapper

MD5 = "91e88a39959c3736becfe898239a5a31"


def build(root, base_url):
    url = f"{base_url}/dataset.csv"
    file_url = IterableWrapper([url])
    http_reader_dp = HttpReader(file_url, timeout=30)
    return {
        "rows": http_reader_dp.parse_csv(skip_lines=1),
        "saved": IterableWrapper([url])
        .read_from_http()
        .map(lambda item: (item[0].rsplit("/", 1)[1], item[1].read()))
        .save_to_disk(mode="wb", filepath_fn=lambda name: f"{root}/downloads/{name}"),
        "checked": FileOpener([f"{root}/served/dataset.csv"], mode="b")
        .check_hash({f"{root}/served/dataset.csv": MD5}, "md5")
        .parse_csv(skip_lines=18),
    }
