"""The Ray strategy: classic workers as Ray actors (``pool.py``), each epoch one
streaming call per actor (``actor.py``) read by the main process (``channel.py``);
Ray itself, optional, in ``handle.py``."""
