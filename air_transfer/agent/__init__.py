"""The per-node agent actor (``actor.NodeAgent``): the composition root of the node
services. Started and found by name through ``air_transfer.nodes``."""
