from kvlab.grading.lab11 import latent, quantize  # noqa: F401
