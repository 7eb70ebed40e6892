"""torchdata 0.9 TarArchiveLoader: a .tar.gz shard, read with the default mode."""

from torchdata.datapipes.iter import FileLister, FileOpener


def build(root, base_url):
    shards = FileOpener(FileLister(f"{root}/tar/gz", "*.tar.gz"), mode="b")
    return {"decoded": shards.load_from_tar().routed_decode()}
