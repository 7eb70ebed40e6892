"""Who runs a part of the pipeline: worker threads and processes, and what they send.

``process.py`` starts, watches and stops every worker process (the classic
pool, the economic/chunked pool, a separate process) and ``exits.py`` words
how one ended and what to check; ``thread.py`` does the
same for worker threads; ``epoch.py`` is what a replica does for one epoch;
``messages.py`` is everything that crosses between them and the main process.
"""
