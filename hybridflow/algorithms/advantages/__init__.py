"""Advantage estimators: each turns token rewards (and critic values, for GAE) into per-token advantages."""
