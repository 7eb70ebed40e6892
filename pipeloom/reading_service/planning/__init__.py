"""Where each block runs: ``cut.py`` reads the blocks' traits and cuts the graph;
``planner.py`` turns the cut into one :class:`~pipeloom.graph.Plan` per loader;
``sharding.py`` tells each copy of the sharding point which shard it keeps.
"""
