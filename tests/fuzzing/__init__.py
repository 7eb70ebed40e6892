"""The resume fuzzer's machinery (``scripts/fuzz_resume.py`` is its command line)."""
