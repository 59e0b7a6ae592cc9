"""Activities: everything that touches the network, disk, clock or environment."""
