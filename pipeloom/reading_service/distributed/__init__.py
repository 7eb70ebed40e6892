"""Ranks of a ``torch.distributed`` job: the job and its collectives (``job.py``), and one
rank's epoch, ended together with the others (``rank_epoch.py``). The service itself is
``services/distributed.py``.
"""
