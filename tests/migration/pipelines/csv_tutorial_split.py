"""torchdata 0.9 docs, "DataPipe Tutorial" > "Using DataPipes": list, filter, open, parse, split."""

import torchdata.datapipes as dp


def build(root, base_url):
    FOLDER = f"{root}/csv"
    datapipe = dp.iter.FileLister([FOLDER]).filter(
        filter_fn=lambda filename: filename.endswith(".csv")
    )
    datapipe = dp.iter.FileOpener(datapipe, mode="rt")
    datapipe = datapipe.parse_csv(delimiter=",")
    N_ROWS = 33  # total number of rows of data
    train, valid = datapipe.random_split(
        total_length=N_ROWS, weights={"train": 0.5, "valid": 0.5}, seed=0
    )
    return {"train": train, "valid": valid}
