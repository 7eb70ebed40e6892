"""The public reading services: thin facades that validate, plan once and delegate.

Each service chooses a runner (``strategies/``) at ``initialize`` and passes
every call on to it; ``base.py`` holds the interface and the shared facade.
"""
