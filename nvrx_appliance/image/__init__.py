"""The appliance image: pins, the one install script, builders, inspect."""
