"""collabrl: multi-model collaborative reasoning — training and evaluation."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("collabrl")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"
