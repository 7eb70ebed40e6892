"""What the economic and chunked strategies share: the main process hands out the work.

``dispatcher.py`` reads the sharding point in the main process, hands each
item (economic) or chunk (chunked) to a worker chosen by ``least_loaded.py``,
and yields the results in source order; ``pool.py`` holds the item and batch
worker processes and their queues; ``item_worker.py`` and ``batch_worker.py``
are those processes' loops, ``chain.py`` the part of the pipeline each runs
per task; ``runner.py`` runs the epochs.
"""
