"""The maintainer's check across diffusers revisions: `harness ab` (two revisions, one report), `harness bisect` (the
first revision that changed a case) and `harness repro` (one standalone script for an upstream report).

Each revision gets its own environment (`envs`), and every run in it is a `harness` subprocess of that environment,
so this package depends on the harness's internals only through its command line and a few stable entry points.
"""
