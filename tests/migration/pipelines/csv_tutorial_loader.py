"""torchdata 0.9 docs, "DataPipe Tutorial" > "Working with DataLoader": build_datapipes()."""

import numpy as np
import torchdata.datapipes as dp

ORDER = "any"  # the pipeline shuffles


def filter_for_data(filename):
    return "sample_data" in filename and filename.endswith(".csv")


def row_processer(row):
    return {"label": np.array(row[0], np.int32), "data": np.array(row[1:], dtype=np.float64)}


def build_datapipes(root_dir="."):
    datapipe = dp.iter.FileLister(root_dir)
    datapipe = datapipe.filter(filter_fn=filter_for_data)
    datapipe = datapipe.open_files(mode="rt")
    datapipe = datapipe.parse_csv(delimiter=",", skip_lines=1)
    # Shuffle will happen as long as you do NOT set `shuffle=False` later in the DataLoader
    datapipe = datapipe.shuffle()
    datapipe = datapipe.sharding_filter()
    datapipe = datapipe.map(row_processer)
    return datapipe


def build(root, base_url):
    return {"rows": build_datapipes(f"{root}/csv")}
