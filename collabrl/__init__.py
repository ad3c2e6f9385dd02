"""collabrl: multi-model collaborative reasoning — training and evaluation."""


def __getattr__(name: str) -> str:
    # `__version__` is read from the installed metadata when asked for, not on import:
    # importing the package stays cheap, and `collab` guards everything slower (cli).
    if name != "__version__":
        raise AttributeError(f"module 'collabrl' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("collabrl")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0+source"
