"""Training methods, one module each: sft, grpo, relay, eapo, rsim.

Each module defines `SPEC`, a `MethodSpec` (`spec.py`): everything that differs between
methods, looked up once by name (`registry.py`). A new method is one module like these
and its registration: an entry point in the group `collabrl.methods`, or `register`.
"""
