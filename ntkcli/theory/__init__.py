"""The two papers' models, their closed-form kernels, and the empirical NTK they are checked against."""
