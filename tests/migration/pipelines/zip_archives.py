"""torchdata 0.9 ZipArchiveLoader docs: zip archives opened, members read; CSV members parsed."""

from torchdata.datapipes.iter import FileLister, FileOpener


def build(root, base_url):
    datapipe1 = FileLister(f"{root}/zip", "*.zip")
    datapipe2 = FileOpener(datapipe1, mode="b")
    zip_loader_dp = datapipe2.load_from_zip()
    return {
        "members": zip_loader_dp.map(lambda item: (item[0], item[1].read())),
        "rows": FileOpener(FileLister(f"{root}/zip", "*.zip"), mode="b")
        .load_from_zip()
        .filter(lambda item: item[0].endswith(".csv"))
        .parse_csv_as_dict(return_path=True),
    }
