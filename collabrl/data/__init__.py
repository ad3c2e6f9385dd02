"""Benchmarks, prompt templates and the data sets they load."""
