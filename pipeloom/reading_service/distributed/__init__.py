"""Ranks of a ``torch.distributed`` job: the job and its collectives (``job.py``), and one
rank's epoch, ended together with the others (``rank_epoch.py``), and a checkpoint's
picture of the job for a resume on another number of ranks (``elastic.py``). The service is
``services/distributed.py``.
"""
