"""Parity harness for multi-device diffusion inference (context parallel, tensor parallel, attention backends)."""

__version__ = "0.1.0"

# Bumped whenever the reference file layout changes; readers refuse newer schemas.
SCHEMA_VERSION = 1
