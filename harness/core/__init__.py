"""Foundations both sides share: errors, typed records, layouts, references, versions."""
