"""KL to the reference: per-token estimators and the coefficient's controllers."""
