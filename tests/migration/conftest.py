# The pipelines are torchdata code that the test runs with ported imports:
# pytest must not import them itself.
collect_ignore_glob = ["pipelines/*.py"]
