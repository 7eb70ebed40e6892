"""How a planned pipeline's epochs run: one runner per strategy, behind one interface.

``runner.py`` is the interface every service delegates to. ``in_process.py``
runs everything in the calling thread; ``classic/`` runs replicas of the
workers' part (in threads or processes) and merges their outputs by position;
``economic.py`` and ``chunked.py`` read the source in the main process and
hand items or chunks to worker processes, sharing the machinery in
``dispatch/``. ``main_part.py`` is what the main process runs beside workers.
"""
