"""dlcloud: a self-hosted cloud deep-learning platform."""

__version__ = "0.1.0"
