"""torchdata 0.9 Bz2FileLoader / XzFileLoader / Decompressor docs: single compressed files."""

from torchdata.datapipes.iter import FileLister, FileOpener


def build(root, base_url):
    folder = f"{root}/compressed"
    return {
        "bz2": FileOpener(FileLister(folder, "*.bz2"), mode="b")
        .load_from_bz2()
        .map(lambda item: (item[0], item[1].read())),
        "xz": FileOpener(FileLister(folder, "*.xz"), mode="b")
        .load_from_xz()
        .map(lambda item: (item[0], item[1].read())),
        "decompressed_lines": FileOpener(FileLister(folder), mode="b").decompress().readlines(),
        "gzip_by_type": FileOpener(FileLister(folder, "*.gz"), mode="b")
        .extract(file_type="gzip")
        .read_from_stream(),
    }
