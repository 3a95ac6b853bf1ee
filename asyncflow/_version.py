"""The installed asyncflow version, read by the build and reported in every status document."""

__version__ = "0.1.0"
