"""What runs inside each torchrun rank: the worker loop, case execution, backends, kernels, shims."""
