"""What happens to the per-sample scores before advantages: shaping them, filtering groups by them."""
