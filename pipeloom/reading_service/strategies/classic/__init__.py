"""Classic: every worker runs a replica of the source, keeps its shard; outputs merged by position.

``runner.py`` runs the epochs; ``merge.py`` puts the workers' outputs back in
source order; ``thread_pool.py`` and ``process_pool.py`` are the two kinds of
workers (``ThreadReadingService`` and ``MultiProcessingReadingService``).
"""
