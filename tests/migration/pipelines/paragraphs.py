"""torchdata 0.9 ParagraphAggregator docs: text files read line by line, joined into paragraphs."""

from torchdata.datapipes.iter import FileLister, FileOpener


def build(root, base_url):
    files = FileOpener(FileLister(f"{root}/text", "corpus-*.txt"), mode="r")
    return {
        "paragraphs": files.readlines().lines_to_paragraphs(),
        "joined_by_space": FileOpener(FileLister(f"{root}/text", "corpus-*.txt"), mode="b")
        .readlines(decode=True)
        .lines_to_paragraphs(joiner=lambda ls: " ".join(ls)),
    }
