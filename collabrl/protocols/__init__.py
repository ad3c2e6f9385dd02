"""Protocols: the rule of each method for who writes next, producing Episodes."""
