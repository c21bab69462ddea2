"""SPADER reproduction: pure core (text, rewards, advantage, metrics, data) plus framework glue."""

__version__ = "0.2.0"
