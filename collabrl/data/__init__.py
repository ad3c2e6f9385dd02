"""Benchmarks, prompt templates and (later) training-set builders."""
