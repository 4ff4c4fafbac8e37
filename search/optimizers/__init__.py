"""What to try next: the genome and its grid, the optimizers (LongRoPE's evolution, CMA-ES, gradient descent,
the hybrid), racing and the objective mix. Plain numpy with the ask/tell shape; no model, no Ray, no files."""
