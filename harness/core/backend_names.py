"""Which attention backends run where: the one statement of it (plans, the probe and the defaults read it)."""

# PyTorch's own SDPA family and flex attention: they run on every device, so a probe that fails for one of them is a
# broken backend (an ERROR), never a backend that is unavailable here (a SKIP).
EVERY_DEVICE = ("native", "_native_math", "_native_flash", "flex")
# Backends that need CUDA (and often a package): on a CPU machine they are SKIP with the probe's reason.
CUDA_ONLY = ("_native_cudnn", "_native_efficient", "flash", "_flash_3", "sage", "xformers")
