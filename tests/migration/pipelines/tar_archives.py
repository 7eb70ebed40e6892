"""torchdata 0.9 TarArchiveLoader docs: tar shards listed, opened, read, decoded by extension."""

from torchdata.datapipes.iter import FileLister, FileOpener


def build(root, base_url):
    datapipe1 = FileLister(f"{root}/tar", "*.tar")
    datapipe2 = FileOpener(datapipe1, mode="b")
    tar_loader_dp = datapipe2.load_from_tar()
    return {
        "decoded": tar_loader_dp.routed_decode(),
        "lines": FileOpener(FileLister(f"{root}/tar", "*.tar"), mode="b")
        .load_from_tar()
        .filter(lambda item: item[0].endswith(".txt"))
        .readlines(decode=True),
    }
