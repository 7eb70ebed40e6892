"""torchdata 0.9 OnDiskCacheHolder docs: an HTTP download cached on disk, then read."""

import os

from torchdata.datapipes.iter import HttpReader, IterableWrapper


def build(root, base_url):
    url = IterableWrapper([f"{base_url}/dataset.csv"])

    def _filepath_fn(url):
        return os.path.join(f"{root}/cache", os.path.basename(url))

    cache_dp = url.on_disk_cache(filepath_fn=_filepath_fn)
    cache_dp = HttpReader(cache_dp).end_caching(mode="wb", filepath_fn=_filepath_fn)
    return {"rows": cache_dp.open_files(mode="r").parse_csv(skip_lines=1)}
