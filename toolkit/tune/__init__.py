"""`toolkit tune`: a configuration search in the spirit of Triton's Model Analyzer, with the real
runtime under generated load (search.py is the entry point)."""

from .search import TuneError, TuneOptions, TuneReport, run

__all__ = ["TuneError", "TuneOptions", "TuneReport", "run"]
