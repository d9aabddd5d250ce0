"""What the harness knows of diffusers' parallel code for `harness run --coverage`: which modules and statements
are measured (scope), and why a statement a plan never executed was not (reasons)."""
