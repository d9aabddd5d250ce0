"""What the harness knows of diffusers' models: the tiny zoo and the tiny pipelines."""
