"""Front end: text -> AST (`parse_text`, `parse_file`) and AST -> forward graph (`elaborate`)."""

from deepdsl.frontend.parser import parse_file, parse_text

__all__ = ["parse_file", "parse_text"]
