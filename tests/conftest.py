"""Test configuration: float64 everywhere and strict dtype promotion, so an accidental
float32/float64 or int/float mix in the library is an error rather than a silent cast."""

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
