"""torchdata 0.9 MaxTokenBucketizer docs: sentences batched by a token budget."""

from torchdata.datapipes.iter import FileLister, FileOpener, IterableWrapper


def build(root, base_url):
    sentences = FileOpener(FileLister(f"{root}/text", "sentences.txt")).readlines(return_path=False)
    source_dp = IterableWrapper(["1", "11", "1", "1111", "111", "1", "11", "11", "111"])
    return {
        "doc_example": source_dp.max_token_bucketize(max_token_count=5),
        "doc_example_small_buffer": source_dp.max_token_bucketize(max_token_count=4, buffer_size=4),
        "tokens": sentences.map(str.split).max_token_bucketize(
            max_token_count=12, len_fn=len, buffer_size=8
        ),
    }
