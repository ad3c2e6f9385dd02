"""Builders of training sets.

This package turns shipped or user data into training sets: RelayLLM's warm-up
data and teacher filtering, rSIM's warm-up data, this project's warm-up data for
EAPO's consult format, and decontamination against the evaluation benchmarks.
`collabrl.data` stays the registry and the loaders; builders read through it and
never define data of their own.
"""
